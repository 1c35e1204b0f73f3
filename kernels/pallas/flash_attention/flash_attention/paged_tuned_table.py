"""Ragged paged attention blocks tuned per TPU generation, shipped with the release (data only; paged_tuning reads it).

Key: (generation, page_size, query dtype, cache dtype, q_heads, kv_heads, head_dim, length bucket = positions per
sequence rounded up to a power of two). Value: (block_q, pages_per_block): tokens per work item for sequences with
more than one new token (decode steps always run one token per item) and cache pages per kv step.

Origin: chosen by kernel-hub's TPU cost model (tpu_cost_model.kernel_cost, modeled time, not a measurement: no TPU
ran them) as the fastest of a sweep over pages_per_block in {8, 16, 32} on the decode batch (64 sequences of one
new token over the bucket's length) and block_q in {8, 16, 32} on the mixed batch (4 prefill chunks of 496
tokens beside 60 decode steps), each entry then compiled by libtpu 0.0.42.1 for its generation's mock topology
(bench/paged_tune.py prints this table; the compile gate's fwd:paged model cases compile every entry again and
record which one they used).
"""

from __future__ import annotations

TUNED: dict[tuple[str, int, str, str, int, int, int, int], tuple[int, int]] = {
}
