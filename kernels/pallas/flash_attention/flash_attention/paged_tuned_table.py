"""Ragged paged attention blocks tuned per TPU generation, shipped with the release (data only; paged_tuning reads it).

Key: (generation, page_size, query dtype, cache dtype, q_heads, kv_heads, head_dim, length bucket = positions per
sequence rounded up to a power of two). Value: Entry(block_q, pages_per_block, origin): tokens per work item for
sequences with more than one new token (decode steps always run one token per item), cache pages per kv step, and
where the entry came from.

Origin: chosen by kernel-hub's TPU cost model (tpu_cost_model.kernel_cost: modeled time with its band, not a
measurement; no TPU ran them) as the fastest of a sweep over pages_per_block in {8, 16, 32, the default's} on the
decode batch (64 sequences of one new token over the bucket's length) and block_q in {8, 16, 32} on the mixed batch
(4 prefill chunks of 496 tokens beside 60 decode steps), beside the blocks the kernel picks without a table
("default"); each entry was then compiled by libtpu for its generation's mock topology, decode and mixed (v7x's 64
MiB of VMEM per core is half a v6e's, so each generation's entries are chosen and compiled on it). Made on 2026-12-05,
a generation at a time, by `python bench/paged_tune.py --generations v5e --lengths 2048,8192,32768 --json`, then
`--generations v6e` and `--generations v7x` at the same lengths with `--merge bench/records/paged_tune.json` (raw
rows and each generation's command: that record; `--table` prints these lines from it). The compile gate's
fwd:paged model cases compile the 8192 entries again and record which one each case used. A shape without an entry
runs the VMEM-safe fallback (config.paged_blocks), its reason in the source.
"""

from __future__ import annotations

from typing import NamedTuple


class Entry(NamedTuple):
    block_q: int
    pages_per_block: int
    origin: str


TUNED: dict[tuple[str, int, str, str, int, int, int, int], Entry] = {
    ('v5e', 128, 'bfloat16', 'bfloat16', 32, 4, 128, 2048):
        Entry(32, 16, 'modeled v5e: decode 415.9 us (band 370.1-472.6) vs default [1, 16] 415.9 us (band '
              '370.1-472.6); mixed 2288.0 us (band 2086.0-2534.0) vs default [32, 16] 2288.0 us (band '
              '2086.0-2534.0); compiled yes (libtpu 0.0.52, 2026-12-05)'),
    ('v5e', 128, 'bfloat16', 'bfloat16', 16, 8, 256, 2048):
        Entry(32, 8, 'modeled v5e: decode 801.2 us (band 714.9-909.3) vs default [1, 9] 897.6 us (band '
              '801.1-1018.6); mixed 3788.1 us (band 3428.1-4234.0) vs default [32, 10] 3390.4 us (band '
              '3072.3-3783.3); compiled yes (libtpu 0.0.52, 2026-12-05)'),
    ('v5e', 128, 'bfloat16', 'bfloat16', 16, 2, 512, 2048):
        Entry(32, 16, 'modeled v5e: decode 803.0 us (band 716.5-911.3) vs default [1, 16] 803.0 us (band '
              '716.5-911.3); mixed 3826.4 us (band 3462.4-4277.5) vs default [32, 16] 3826.4 us (band '
              '3462.4-4277.5); compiled yes (libtpu 0.0.52, 2026-12-05)'),
    ('v5e', 128, 'bfloat16', 'bfloat16', 32, 4, 128, 8192):
        Entry(32, 16, 'modeled v5e: decode 1572.7 us (band 1405.1-1783.6) vs default [1, 16] 1572.7 us (band '
              '1405.1-1783.6); mixed 3758.2 us (band 3467.3-4200.1) vs default [32, 16] 3758.2 us (band '
              '3467.3-4200.1); compiled yes (libtpu 0.0.52, 2026-12-05)'),
    ('v5e', 128, 'bfloat16', 'bfloat16', 16, 8, 256, 8192):
        Entry(32, 8, 'modeled v5e: decode 801.3 us (band 714.9-909.3) vs default [1, 9] 897.6 us (band '
              '801.1-1018.6); mixed 3788.1 us (band 3428.1-4234.1) vs default [32, 10] 3390.4 us (band '
              '3072.3-3783.4); compiled yes (libtpu 0.0.52, 2026-12-05)'),
    ('v5e', 128, 'bfloat16', 'bfloat16', 16, 2, 512, 8192):
        Entry(32, 16, 'modeled v5e: decode 3116.6 us (band 2786.5-3533.4) vs default [1, 16] 3116.6 us (band '
              '2786.5-3533.4); mixed 6766.6 us (band 6093.2-7609.7) vs default [32, 16] 6766.6 us (band '
              '6093.2-7609.7); compiled yes (libtpu 0.0.52, 2026-12-05)'),
    ('v5e', 128, 'bfloat16', 'bfloat16', 32, 4, 128, 32768):
        Entry(32, 32, 'modeled v5e: decode 6200.0 us (band 5545.3-7027.9) vs default [1, 16] 6200.0 us (band '
              '5545.3-7027.9); mixed 8232.8 us (band 7513.0-9134.6) vs default [32, 16] 8561.4 us (band '
              '7841.6-9463.2); compiled yes (libtpu 0.0.52, 2026-12-05)'),
    # v5e/128/bfloat16/bfloat16/16/8/256/32768 (gemma4_26b_a4b_sliding): not compiled {'decode': 'RESOURCE_EXHAUSTED:
    # E1000: CompileTimeHbmOom: Ran out of memory on HBM, the total memory required for HLO temporaries (16.00G) exceeds
    # available HBM (15.75G). HLO module: jit_step.', 'mixed': 'RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of
    # memory on HBM, the total memory required for HLO temporaries (16.11G) exceeds available HBM (15.75G). HLO module:
    # jit_step.'}
    ('v5e', 128, 'bfloat16', 'bfloat16', 16, 2, 512, 32768):
        Entry(32, 32, 'modeled v5e: decode 12371.1 us (band 11066.8-14021.8) vs default [1, 16] 12371.1 us (band '
              '11066.9-14021.8); mixed 15442.8 us (band 14009.9-17442.7) vs default [32, 16] 15740.6 us '
              '(band 14338.5-17506.5); compiled yes (libtpu 0.0.52, 2026-12-05)'),
    ('v6e', 128, 'bfloat16', 'bfloat16', 32, 4, 128, 2048):
        Entry(32, 16, 'modeled v6e: decode 223.3 us (band 191.4-260.6) vs default [1, 16] 223.3 us (band '
              '191.4-260.6); mixed 1549.1 us (band 1224.9-1895.2) vs default [32, 16] 1549.1 us (band '
              '1224.9-1895.2); compiled yes (libtpu 0.0.52, 2026-12-05)'),
    ('v6e', 128, 'bfloat16', 'bfloat16', 16, 8, 256, 2048):
        Entry(32, 8, 'modeled v6e: decode 415.8 us (band 363.6-478.7) vs default [1, 9] 463.9 us (band '
              '406.7-533.3); mixed 2298.2 us (band 1895.1-2744.2) vs default [32, 10] 2099.6 us (band '
              '1717.4-2519.1); compiled yes (libtpu 0.0.52, 2026-12-05)'),
    ('v6e', 128, 'bfloat16', 'bfloat16', 16, 2, 512, 2048):
        Entry(32, 16, 'modeled v6e: decode 416.6 us (band 364.4-479.7) vs default [1, 16] 416.6 us (band '
              '364.4-479.7); mixed 2317.2 us (band 1912.2-2765.8) vs default [32, 16] 2317.2 us (band '
              '1912.2-2765.8); compiled yes (libtpu 0.0.52, 2026-12-05)'),
    ('v6e', 128, 'bfloat16', 'bfloat16', 32, 4, 128, 8192):
        Entry(32, 16, 'modeled v6e: decode 801.0 us (band 708.3-915.3) vs default [1, 16] 801.0 us (band '
              '708.3-915.3); mixed 2283.2 us (band 1881.8-2836.8) vs default [32, 16] 2283.2 us (band '
              '1881.8-2836.8); compiled yes (libtpu 0.0.52, 2026-12-05)'),
    ('v6e', 128, 'bfloat16', 'bfloat16', 16, 8, 256, 8192):
        Entry(32, 8, 'modeled v6e: decode 415.8 us (band 363.6-478.8) vs default [1, 9] 463.9 us (band '
              '406.7-533.3); mixed 2298.2 us (band 1895.1-2744.3) vs default [32, 10] 2099.6 us (band '
              '1717.4-2519.2); compiled yes (libtpu 0.0.52, 2026-12-05)'),
    ('v6e', 128, 'bfloat16', 'bfloat16', 16, 2, 512, 8192):
        Entry(32, 16, 'modeled v6e: decode 1572.0 us (band 1398.2-1789.2) vs default [1, 16] 1572.0 us (band '
              '1398.2-1789.2); mixed 3785.6 us (band 3226.0-4429.9) vs default [32, 16] 3785.6 us (band '
              '3226.0-4429.9); compiled yes (libtpu 0.0.52, 2026-12-05)'),
    ('v6e', 128, 'bfloat16', 'bfloat16', 32, 4, 128, 32768):
        Entry(32, 32, 'modeled v6e: decode 3111.8 us (band 2775.9-3534.2) vs default [1, 16] 3111.8 us (band '
              '2775.9-3534.3); mixed 4561.2 us (band 3827.0-5510.1) vs default [32, 16] 4917.4 us (band '
              '4081.7-5967.1); compiled yes (libtpu 0.0.52, 2026-12-05)'),
    ('v7x', 128, 'bfloat16', 'bfloat16', 32, 4, 128, 8192):
        Entry(32, 32, 'modeled v7x: decode 370.2 us (band 363.7-376.7) vs default [1, 16] 370.2 us (band '
              '363.7-376.7); mixed 1514.9 us (band 1285.4-1801.9) vs default [32, 16] 1605.8 us (band '
              '1351.3-1921.8); compiled yes (libtpu 0.0.52, 2026-12-05)'),
    ('v7x', 128, 'bfloat16', 'bfloat16', 16, 8, 256, 8192):
        Entry(32, 8, 'modeled v7x: decode 200.0 us (band 193.5-206.5) vs default [1, 9] 221.3 us (band '
              '214.8-227.8); mixed 1442.1 us (band 1237.6-1646.6) vs default [32, 10] 1354.3 us (band '
              '1149.8-1558.8); compiled yes (libtpu 0.0.52, 2026-12-05)'),
}
