"""Ragged paged attention blocks tuned per TPU generation, shipped with the release (data only; paged_tuning reads it).

Key: (generation, page_size, query dtype, cache dtype, q_heads, kv_heads, head_dim, length bucket = positions per
sequence rounded up to a power of two). Value: Entry(block_q, pages_per_block, origin): tokens per work item for
sequences with more than one new token (decode steps always run one token per item), cache pages per kv step, and
where the entry came from.

Origin: chosen by kernel-hub's TPU cost model (tpu_cost_model.kernel_cost: modeled time with its band, not a
measurement; no TPU ran them) as the fastest of a sweep over pages_per_block in {8, 16, 32, the default's} on the
decode batch (64 sequences of one new token over the bucket's length) and block_q in {8, 16, 32} on the mixed batch
(4 prefill chunks of 496 tokens beside 60 decode steps), beside the blocks the kernel picks without a table
("default"); each entry was then compiled by libtpu for its generation's mock topology, decode and mixed. Made on
2026-12-05 by `python bench/paged_tune.py --generations v5e --lengths 2048,8192,32768 --json` (raw rows:
bench/records/paged_tune.json; `--table` prints these lines from them). v6e and v7x are not swept yet: their calls
run the fallback. The compile gate's fwd:paged model cases compile the 8192 entries again and record which one each
case used. A shape without an entry runs the VMEM-safe fallback (config.paged_blocks), its reason in the source.
"""

from __future__ import annotations

from typing import NamedTuple


class Entry(NamedTuple):
    block_q: int
    pages_per_block: int
    origin: str


TUNED: dict[tuple[str, int, str, str, int, int, int, int], Entry] = {
    ('v5e', 128, 'bfloat16', 'bfloat16', 32, 4, 128, 2048):
        Entry(32, 16, 'modeled v5e: decode 415.9 us (band 370.1-472.6) vs default [1, 16] 415.9 us (band 370.1-472.6);'
              ' mixed 2288.0 us (band 2086.0-2534.0) vs default [32, 16] 2288.0 us (band 2086.0-2534.0); '
              'compiled yes (libtpu 0.0.52, 2026-12-05)'),
    ('v5e', 128, 'bfloat16', 'bfloat16', 16, 8, 256, 2048):
        Entry(32, 8, 'modeled v5e: decode 801.2 us (band 714.9-909.3) vs default [1, 9] 897.6 us (band 801.1-1018.6);'
              ' mixed 3788.1 us (band 3428.1-4234.0) vs default [32, 10] 3390.4 us (band 3072.3-3783.3); '
              'compiled yes (libtpu 0.0.52, 2026-12-05)'),
    ('v5e', 128, 'bfloat16', 'bfloat16', 16, 2, 512, 2048):
        Entry(32, 16, 'modeled v5e: decode 803.0 us (band 716.5-911.3) vs default [1, 16] 803.0 us (band 716.5-911.3);'
              ' mixed 3826.4 us (band 3462.4-4277.5) vs default [32, 16] 3826.4 us (band 3462.4-4277.5); '
              'compiled yes (libtpu 0.0.52, 2026-12-05)'),
    ('v5e', 128, 'bfloat16', 'bfloat16', 32, 4, 128, 8192):
        Entry(32, 16, 'modeled v5e: decode 1572.7 us (band 1405.1-1783.6) vs default [1, 16] 1572.7 us (band '
              '1405.1-1783.6); mixed 3758.2 us (band 3467.3-4200.1) vs default [32, 16] 3758.2 us (band '
              '3467.3-4200.1); compiled yes (libtpu 0.0.52, 2026-12-05)'),
    ('v5e', 128, 'bfloat16', 'bfloat16', 16, 8, 256, 8192):
        Entry(32, 8, 'modeled v5e: decode 801.3 us (band 714.9-909.3) vs default [1, 9] 897.6 us (band 801.1-1018.6);'
              ' mixed 3788.1 us (band 3428.1-4234.1) vs default [32, 10] 3390.4 us (band 3072.3-3783.4); '
              'compiled yes (libtpu 0.0.52, 2026-12-05)'),
    ('v5e', 128, 'bfloat16', 'bfloat16', 16, 2, 512, 8192):
        Entry(32, 16, 'modeled v5e: decode 3116.6 us (band 2786.5-3533.4) vs default [1, 16] 3116.6 us (band '
              '2786.5-3533.4); mixed 6766.6 us (band 6093.2-7609.7) vs default [32, 16] 6766.6 us (band '
              '6093.2-7609.7); compiled yes (libtpu 0.0.52, 2026-12-05)'),
    ('v5e', 128, 'bfloat16', 'bfloat16', 32, 4, 128, 32768):
        Entry(32, 32, 'modeled v5e: decode 6200.0 us (band 5545.3-7027.9) vs default [1, 16] 6200.0 us (band '
              '5545.3-7027.9); mixed 8232.8 us (band 7513.0-9134.6) vs default [32, 16] 8561.4 us (band '
              '7841.6-9463.2); compiled yes (libtpu 0.0.52, 2026-12-05)'),
    # v5e/128/bfloat16/bfloat16/16/8/256/32768 (gemma4_26b_a4b_sliding): not compiled {'decode':
    # 'RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory on HBM, the total memory required for HLO
    # temporaries (16.00G) exceeds available HBM (15.75G). HLO module: jit_step.', 'mixed': 'RESOURCE_EXHAUSTED:
    # E1000: CompileTimeHbmOom: Ran out of memory on HBM, the total memory required for HLO temporaries (16.11G)
    # exceeds available HBM (15.75G). HLO module: jit_step.'}
    ('v5e', 128, 'bfloat16', 'bfloat16', 16, 2, 512, 32768):
        Entry(32, 32, 'modeled v5e: decode 12371.1 us (band 11066.8-14021.8) vs default [1, 16] 12371.1 us (band '
              '11066.9-14021.8); mixed 15442.8 us (band 14009.9-17442.7) vs default [32, 16] 15740.6 us (band '
              '14338.5-17506.5); compiled yes (libtpu 0.0.52, 2026-12-05)'),
}
