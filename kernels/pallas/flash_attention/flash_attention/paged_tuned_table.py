"""Ragged paged attention blocks tuned per TPU generation, shipped with the release (data only; paged_tuning reads it).

Key: (generation, page_size, query dtype, cache dtype, q_heads, kv_heads, head_dim, length bucket = positions per
sequence rounded up to a power of two). Value: Entry(block_q, pages_per_block, origin): tokens per work item for
sequences with more than one new token (decode steps always run one token per item), cache pages per kv step, and
where the entry came from.

Origin: chosen by kernel-hub's TPU cost model (tpu_cost_model.kernel_cost: modeled time with its band, not a
measurement; no TPU ran them) as the fastest of a sweep over pages_per_block in {8, 16, 32, the default's} on the
decode batch (64 sequences of one new token over the bucket's length) and block_q in {8, ..., 512} on the mixed batch
(4 prefill chunks of 496 tokens beside 60 decode steps), beside the blocks the kernel picks without a table
("default"); each entry was then compiled by libtpu for its generation's mock topology, decode and mixed (v7x's 64
MiB of VMEM per core is half a v6e's, so each generation's entries are chosen and compiled on it). Made on 2026-12-06,
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
    ('v7x', 128, 'bfloat16', 'bfloat16', 32, 4, 128, 2048):
        Entry(128, 16, 'modeled v7x: decode 89.0 us (band 89.0-89.0) vs default [1, 16] 89.0 us (band 89.0-89.0); '
              'mixed 137.8 us (band 128.2-180.3) vs default [32, 16] 181.5 us (band 179.8-201.0); '
              'compiled yes (libtpu 0.0.52, 2026-12-06)'),
    ('v7x', 128, 'bfloat16', 'bfloat16', 16, 8, 256, 2048):
        Entry(256, 8, 'modeled v7x: decode 174.3 us (band 174.2-174.3) vs default [1, 9] 174.2 us (band '
              '174.2-174.2); mixed 216.3 us (band 216.2-216.3) vs default [32, 10] 383.3 us (band '
              '383.3-383.3); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    ('v7x', 128, 'bfloat16', 'bfloat16', 16, 2, 512, 2048):
        Entry(128, 8, 'modeled v7x: decode 174.5 us (band 174.5-174.5) vs default [1, 16] 174.5 us (band '
              '174.5-174.5); mixed 234.6 us (band 233.8-236.3) vs default [32, 16] 350.1 us (band '
              '349.3-351.8); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    ('v7x', 128, 'bfloat16', 'bfloat16', 32, 4, 128, 8192):
        Entry(128, 16, 'modeled v7x: decode 344.2 us (band 344.2-344.2) vs default [1, 16] 344.2 us (band '
              '344.2-344.2); mixed 384.7 us (band 383.0-424.7) vs default [32, 16] 505.9 us (band '
              '504.2-507.6); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    ('v7x', 128, 'bfloat16', 'bfloat16', 16, 8, 256, 8192):
        Entry(256, 8, 'modeled v7x: decode 174.3 us (band 174.2-174.3) vs default [1, 9] 174.2 us (band '
              '174.2-174.3); mixed 216.3 us (band 216.2-216.3) vs default [32, 10] 383.3 us (band '
              '383.3-383.3); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    ('v7x', 128, 'bfloat16', 'bfloat16', 16, 2, 512, 8192):
        Entry(128, 8, 'modeled v7x: decode 684.9 us (band 684.9-685.0) vs default [1, 16] 684.9 us (band '
              '684.9-684.9); mixed 755.7 us (band 754.9-757.4) vs default [32, 16] 998.8 us (band '
              '998.0-1000.5); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    ('v7x', 128, 'bfloat16', 'bfloat16', 32, 4, 128, 32768):
        Entry(256, 8, 'modeled v7x: decode 1365.2 us (band 1365.2-1365.2) vs default [1, 16] 1365.2 us (band '
              '1365.2-1365.2); mixed 1321.9 us (band 1320.2-1367.8) vs default [32, 16] 1463.0 us (band '
              '1461.3-1464.7); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    ('v7x', 128, 'bfloat16', 'bfloat16', 16, 8, 256, 32768):
        Entry(256, 8, 'modeled v7x: decode 174.3 us (band 174.3-174.3) vs default [1, 9] 174.3 us (band '
              '174.3-174.3); mixed 216.3 us (band 216.3-216.3) vs default [32, 10] 383.3 us (band '
              '383.3-383.4); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    ('v7x', 128, 'bfloat16', 'bfloat16', 16, 2, 512, 32768):
        Entry(128, 8, 'modeled v7x: decode 2726.9 us (band 2726.9-2726.9) vs default [1, 16] 2726.9 us (band '
              '2726.9-2726.9); mixed 2670.0 us (band 2669.2-2671.7) vs default [32, 16] 2913.1 us (band '
              '2912.3-2914.8); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    ('v6e', 128, 'bfloat16', 'bfloat16', 32, 4, 128, 2048):
        Entry(512, 16, 'modeled v6e: decode 197.2 us (band 174.3-225.6) vs default [1, 16] 197.2 us (band '
              '174.3-225.6); mixed 235.9 us (band 206.7-272.4) vs default [32, 16] 395.1 us (band '
              '349.1-452.8); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    ('v6e', 128, 'bfloat16', 'bfloat16', 16, 8, 256, 2048):
        Entry(512, 9, 'modeled v6e: decode 390.2 us (band 347.0-444.3) vs default [1, 9] 390.2 us (band '
              '347.0-444.3); mixed 455.5 us (band 403.2-520.4) vs default [32, 10] 859.2 us (band '
              '764.4-977.8); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    ('v6e', 128, 'bfloat16', 'bfloat16', 16, 2, 512, 2048):
        Entry(256, 16, 'modeled v6e: decode 390.7 us (band 347.5-444.9) vs default [1, 16] 390.7 us (band '
              '347.5-444.9); mixed 476.5 us (band 422.0-544.1) vs default [32, 16] 782.2 us (band '
              '695.6-890.6); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    ('v6e', 128, 'bfloat16', 'bfloat16', 32, 4, 128, 8192):
        Entry(512, 16, 'modeled v6e: decode 774.9 us (band 691.2-880.3) vs default [1, 16] 774.9 us (band '
              '691.2-880.3); mixed 789.5 us (band 702.0-899.8) vs default [32, 16] 1129.2 us (band '
              '1006.0-1284.8); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    ('v6e', 128, 'bfloat16', 'bfloat16', 16, 8, 256, 8192):
        Entry(512, 9, 'modeled v6e: decode 390.2 us (band 347.0-444.3) vs default [1, 9] 390.2 us (band '
              '347.0-444.3); mixed 455.5 us (band 403.2-520.4) vs default [32, 10] 859.2 us (band '
              '764.4-977.8); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    ('v6e', 128, 'bfloat16', 'bfloat16', 16, 2, 512, 8192):
        Entry(256, 16, 'modeled v6e: decode 1546.1 us (band 1381.2-1754.3) vs default [1, 16] 1546.1 us (band '
              '1381.2-1754.3); mixed 1607.8 us (band 1434.3-1826.2) vs default [32, 16] 2250.5 us (band '
              '2009.3-2554.7); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    ('v6e', 128, 'bfloat16', 'bfloat16', 32, 4, 128, 32768):
        Entry(512, 16, 'modeled v6e: decode 3085.7 us (band 2758.8-3499.2) vs default [1, 16] 3085.7 us (band '
              '2758.8-3499.2); mixed 2955.9 us (band 2640.4-3355.0) vs default [32, 16] 3295.6 us (band '
              '2944.3-3740.0); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    ('v6e', 128, 'bfloat16', 'bfloat16', 16, 8, 256, 32768):
        Entry(512, 9, 'modeled v6e: decode 390.3 us (band 347.1-444.4) vs default [1, 9] 390.3 us (band '
              '347.1-444.4); mixed 455.5 us (band 403.3-520.4) vs default [32, 10] 859.2 us (band '
              '764.5-977.9); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    ('v6e', 128, 'bfloat16', 'bfloat16', 16, 2, 512, 32768):
        Entry(256, 16, 'modeled v6e: decode 6167.7 us (band 5516.4-6992.1) vs default [1, 16] 6167.7 us (band '
              '5516.4-6992.1); mixed 5940.5 us (band 5310.9-6736.7) vs default [32, 16] 6583.3 us (band '
              '5886.0-7465.1); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    ('v5e', 128, 'bfloat16', 'bfloat16', 32, 4, 128, 2048):
        Entry(512, 16, 'modeled v5e: decode 391.4 us (band 348.1-445.6) vs default [1, 16] 391.4 us (band '
              '348.1-445.6); mixed 465.1 us (band 411.9-531.1) vs default [32, 16] 783.8 us (band '
              '697.0-892.3); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    ('v5e', 128, 'bfloat16', 'bfloat16', 16, 8, 256, 2048):
        Entry(512, 9, 'modeled v5e: decode 777.9 us (band 693.9-883.6) vs default [1, 9] 777.9 us (band '
              '693.9-883.6); mixed 905.0 us (band 805.5-1029.7) vs default [32, 10] 1713.3 us (band '
              '1528.7-1945.7); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    ('v5e', 128, 'bfloat16', 'bfloat16', 16, 2, 512, 2048):
        Entry(256, 16, 'modeled v5e: decode 778.9 us (band 694.8-884.8) vs default [1, 16] 778.9 us (band '
              '694.8-884.8); mixed 947.1 us (band 843.2-1077.4) vs default [32, 16] 1559.3 us (band '
              '1390.9-1771.2); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    ('v5e', 128, 'bfloat16', 'bfloat16', 32, 4, 128, 8192):
        Entry(512, 16, 'modeled v5e: decode 1548.2 us (band 1383.1-1756.7) vs default [1, 16] 1548.2 us (band '
              '1383.1-1756.7); mixed 1573.6 us (band 1403.8-1787.5) vs default [32, 16] 2253.9 us (band '
              '2012.4-2558.4); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    ('v5e', 128, 'bfloat16', 'bfloat16', 16, 8, 256, 8192):
        Entry(512, 9, 'modeled v5e: decode 777.9 us (band 693.9-883.7) vs default [1, 9] 777.9 us (band '
              '693.9-883.7); mixed 905.0 us (band 805.6-1029.7) vs default [32, 10] 1713.3 us (band '
              '1528.7-1945.8); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    ('v5e', 128, 'bfloat16', 'bfloat16', 16, 2, 512, 8192):
        Entry(256, 16, 'modeled v5e: decode 3092.5 us (band 2764.8-3506.9) vs default [1, 16] 3092.5 us (band '
              '2764.8-3506.9); mixed 3212.4 us (band 2870.1-3644.8) vs default [32, 16] 4499.4 us (band '
              '4021.6-5103.4); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    ('v5e', 128, 'bfloat16', 'bfloat16', 32, 4, 128, 32768):
        Entry(512, 16, 'modeled v5e: decode 6175.5 us (band 5523.3-7000.9) vs default [1, 16] 6175.5 us (band '
              '5523.3-7000.9); mixed 5911.7 us (band 5285.1-6703.9) vs default [32, 16] 6591.9 us (band '
              '5893.8-7474.9); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    # v5e/128/bfloat16/bfloat16/16/8/256/32768 (gemma4_26b_a4b_sliding): not compiled {'decode': 'RESOURCE_EXHAUSTED:
    # E1000: CompileTimeHbmOom: Ran out of memory on HBM, the total memory required for HLO temporaries (16.00G) exceeds
    # available HBM (15.75G). HLO module: jit_step.', 'mixed': 'RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of
    # memory on HBM, the total memory required for HLO temporaries (16.05G) exceeds available HBM (15.75G). HLO module:
    # jit_step.'}
    ('v5e', 128, 'bfloat16', 'bfloat16', 16, 2, 512, 32768):
        Entry(256, 16, 'modeled v5e: decode 12347.0 us (band 11045.2-13995.3) vs default [1, 16] 12347.0 us (band '
              '11045.2-13995.3); mixed 11888.4 us (band 10632.7-13477.6) vs default [32, 16] 13175.4 us '
              '(band 11784.3-14936.2); compiled yes (libtpu 0.0.52, 2026-12-06)'),
}
