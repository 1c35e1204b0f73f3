"""Ragged paged attention blocks tuned per TPU generation, shipped with the release (data only; paged_tuning reads it).

Key: (generation, page_size, query dtype, cache dtype, q_heads, kv_heads, head_dim, length bucket = positions per
sequence rounded up to a power of two). Value: Entry(block_q, pages_per_block, origin): tokens per work item for
sequences with more than one new token (decode steps always run one token per item), cache pages per kv step, and
where the entry came from.

Origin: chosen by kernel-hub's TPU cost model (tpu_cost_model.kernel_cost: modeled time with its band, not a
measurement; no TPU ran them) as the fastest of a sweep over pages_per_block in {8, 16, 32, the default's} on the
decode batch (64 sequences of one new token over the bucket's length) and block_q in {8, ..., 256} on the mixed batch
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
    ('v6e', 128, 'bfloat16', 'bfloat16', 32, 4, 128, 2048):
        Entry(256, 8, 'modeled v6e: decode 197.2 us (band 174.3-225.6) vs default [1, 16] 197.2 us (band '
              '174.3-225.6); mixed 265.7 us (band 228.6-309.3) vs default [32, 16] 431.5 us (band '
              '377.0-497.2); compiled yes (libtpu 0.0.52, 2026-12-05)'),
    ('v6e', 128, 'bfloat16', 'bfloat16', 16, 8, 256, 2048):
        Entry(256, 8, 'modeled v6e: decode 390.2 us (band 347.0-444.3) vs default [1, 9] 438.4 us (band '
              '390.1-498.9); mixed 517.1 us (band 455.7-594.2) vs default [32, 10] 991.1 us (band '
              '879.9-1131.4); compiled yes (libtpu 0.0.52, 2026-12-05)'),
    ('v6e', 128, 'bfloat16', 'bfloat16', 16, 2, 512, 2048):
        Entry(128, 16, 'modeled v6e: decode 390.7 us (band 347.5-444.9) vs default [1, 16] 390.7 us (band '
              '347.5-444.9); mixed 540.2 us (band 474.2-620.4) vs default [32, 16] 828.5 us (band '
              '732.2-947.1); compiled yes (libtpu 0.0.52, 2026-12-05)'),
    ('v6e', 128, 'bfloat16', 'bfloat16', 32, 4, 128, 8192):
        Entry(256, 8, 'modeled v6e: decode 774.9 us (band 691.2-880.3) vs default [1, 16] 774.9 us (band '
              '691.2-880.3); mixed 831.3 us (band 734.7-950.4) vs default [32, 16] 1165.7 us (band '
              '1033.8-1329.3); compiled yes (libtpu 0.0.52, 2026-12-05)'),
    ('v6e', 128, 'bfloat16', 'bfloat16', 16, 8, 256, 8192):
        Entry(256, 8, 'modeled v6e: decode 390.3 us (band 347.0-444.3) vs default [1, 9] 438.4 us (band '
              '390.1-498.9); mixed 517.1 us (band 455.7-594.2) vs default [32, 10] 991.1 us (band '
              '879.9-1131.4); compiled yes (libtpu 0.0.52, 2026-12-05)'),
    ('v6e', 128, 'bfloat16', 'bfloat16', 16, 2, 512, 8192):
        Entry(128, 16, 'modeled v6e: decode 1546.1 us (band 1381.2-1754.3) vs default [1, 16] 1546.1 us (band '
              '1381.2-1754.3); mixed 1719.7 us (band 1529.5-1957.1) vs default [32, 16] 2296.8 us (band '
              '2045.9-2611.2); compiled yes (libtpu 0.0.52, 2026-12-05)'),
    ('v6e', 128, 'bfloat16', 'bfloat16', 32, 4, 128, 32768):
        Entry(256, 8, 'modeled v6e: decode 3085.8 us (band 2758.8-3499.2) vs default [1, 16] 3085.7 us (band '
              '2758.8-3499.2); mixed 2997.7 us (band 2673.0-3405.6) vs default [32, 16] 3332.1 us (band '
              '2972.2-3784.5); compiled yes (libtpu 0.0.52, 2026-12-05)'),
    ('v6e', 128, 'bfloat16', 'bfloat16', 16, 8, 256, 32768):
        Entry(256, 8, 'modeled v6e: decode 390.3 us (band 347.1-444.4) vs default [1, 9] 438.4 us (band '
              '390.1-498.9); mixed 517.1 us (band 455.8-594.3) vs default [32, 10] 991.1 us (band '
              '879.9-1131.5); compiled yes (libtpu 0.0.52, 2026-12-05)'),
    ('v6e', 128, 'bfloat16', 'bfloat16', 16, 2, 512, 32768):
        Entry(128, 16, 'modeled v6e: decode 6167.7 us (band 5516.4-6992.1) vs default [1, 16] 6167.7 us (band '
              '5516.4-6992.1); mixed 6052.4 us (band 5406.2-6867.6) vs default [32, 16] 6629.5 us (band '
              '5922.6-7521.7); compiled yes (libtpu 0.0.52, 2026-12-05)'),
    ('v5e', 128, 'bfloat16', 'bfloat16', 32, 4, 128, 2048):
        Entry(256, 8, 'modeled v5e: decode 391.4 us (band 348.1-445.6) vs default [1, 16] 391.4 us (band '
              '348.1-445.6); mixed 496.4 us (band 442.5-563.2) vs default [32, 16] 828.4 us (band '
              '739.6-939.6); compiled yes (libtpu 0.0.52, 2026-12-05)'),
    ('v5e', 128, 'bfloat16', 'bfloat16', 16, 8, 256, 2048):
        Entry(256, 8, 'modeled v5e: decode 777.9 us (band 693.9-883.6) vs default [1, 9] 874.3 us (band '
              '780.1-992.9); mixed 1022.4 us (band 910.6-1162.8) vs default [32, 10] 1971.6 us (band '
              '1759.8-2238.5); compiled yes (libtpu 0.0.52, 2026-12-05)'),
    ('v5e', 128, 'bfloat16', 'bfloat16', 16, 2, 512, 2048):
        Entry(128, 16, 'modeled v5e: decode 778.9 us (band 694.8-884.8) vs default [1, 16] 778.9 us (band '
              '694.8-884.8); mixed 1046.2 us (band 934.5-1188.4) vs default [32, 16] 1623.4 us (band '
              '1451.0-1842.5); compiled yes (libtpu 0.0.52, 2026-12-05)'),
    ('v5e', 128, 'bfloat16', 'bfloat16', 32, 4, 128, 8192):
        Entry(256, 8, 'modeled v5e: decode 1548.2 us (band 1383.1-1756.7) vs default [1, 16] 1548.2 us (band '
              '1383.1-1756.7); mixed 1629.0 us (band 1456.0-1846.9) vs default [32, 16] 2298.5 us (band '
              '2055.0-2605.7); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    ('v5e', 128, 'bfloat16', 'bfloat16', 16, 8, 256, 8192):
        Entry(256, 8, 'modeled v5e: decode 777.9 us (band 693.9-883.7) vs default [1, 9] 874.3 us (band '
              '780.1-992.9); mixed 1022.5 us (band 910.6-1162.8) vs default [32, 10] 1971.6 us (band '
              '1759.8-2238.5); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    ('v5e', 128, 'bfloat16', 'bfloat16', 16, 2, 512, 8192):
        Entry(128, 16, 'modeled v5e: decode 3092.5 us (band 2764.8-3506.9) vs default [1, 16] 3092.5 us (band '
              '2764.8-3506.9); mixed 3408.0 us (band 3047.6-3865.0) vs default [32, 16] 4563.6 us (band '
              '4081.6-5174.7); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    ('v5e', 128, 'bfloat16', 'bfloat16', 32, 4, 128, 32768):
        Entry(256, 8, 'modeled v5e: decode 6175.5 us (band 5523.3-7000.9) vs default [1, 16] 6175.5 us (band '
              '5523.3-7000.9); mixed 5967.0 us (band 5337.3-6763.3) vs default [32, 16] 6636.6 us (band '
              '5936.4-7522.1); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    # v5e/128/bfloat16/bfloat16/16/8/256/32768 (gemma4_26b_a4b_sliding): not compiled {'decode': 'RESOURCE_EXHAUSTED:
    # E1000: CompileTimeHbmOom: Ran out of memory on HBM, the total memory required for HLO temporaries (16.00G) exceeds
    # available HBM (15.75G). HLO module: jit_step.', 'mixed': 'RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of
    # memory on HBM, the total memory required for HLO temporaries (16.05G) exceeds available HBM (15.75G). HLO module:
    # jit_step.'}
    ('v5e', 128, 'bfloat16', 'bfloat16', 16, 2, 512, 32768):
        Entry(128, 16, 'modeled v5e: decode 12347.0 us (band 11045.2-13995.3) vs default [1, 16] 12347.0 us (band '
              '11045.2-13995.3); mixed 12083.9 us (band 10810.3-13697.7) vs default [32, 16] 13239.6 us '
              '(band 11844.4-15007.5); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    ('v7x', 128, 'bfloat16', 'bfloat16', 32, 4, 128, 2048):
        Entry(64, 16, 'modeled v7x: decode 89.0 us (band 89.0-89.0) vs default [1, 16] 89.0 us (band 89.0-89.0); '
              'mixed 167.0 us (band 159.3-214.0) vs default [32, 16] 209.3 us (band 201.6-228.0); compiled '
              'yes (libtpu 0.0.52, 2026-12-06)'),
    ('v7x', 128, 'bfloat16', 'bfloat16', 16, 8, 256, 2048):
        Entry(128, 8, 'modeled v7x: decode 174.3 us (band 174.2-174.3) vs default [1, 9] 195.5 us (band '
              '195.5-195.5); mixed 289.4 us (band 281.6-297.1) vs default [32, 10] 456.6 us (band '
              '448.9-464.3); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    ('v7x', 128, 'bfloat16', 'bfloat16', 16, 2, 512, 2048):
        Entry(128, 8, 'modeled v7x: decode 174.5 us (band 174.5-174.5) vs default [1, 16] 174.5 us (band '
              '174.5-174.5); mixed 257.4 us (band 249.7-265.1) vs default [32, 16] 384.7 us (band '
              '377.0-392.4); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    ('v7x', 128, 'bfloat16', 'bfloat16', 32, 4, 128, 8192):
        Entry(128, 8, 'modeled v7x: decode 344.2 us (band 344.2-344.2) vs default [1, 16] 344.2 us (band '
              '344.2-344.2); mixed 444.1 us (band 398.9-609.6) vs default [32, 16] 533.7 us (band '
              '526.0-541.4); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    ('v7x', 128, 'bfloat16', 'bfloat16', 16, 8, 256, 8192):
        Entry(128, 8, 'modeled v7x: decode 174.3 us (band 174.2-174.3) vs default [1, 9] 195.5 us (band '
              '195.5-195.5); mixed 289.4 us (band 281.6-297.1) vs default [32, 10] 456.6 us (band '
              '448.9-464.3); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    ('v7x', 128, 'bfloat16', 'bfloat16', 16, 2, 512, 8192):
        Entry(128, 8, 'modeled v7x: decode 684.9 us (band 684.9-685.0) vs default [1, 16] 684.9 us (band '
              '684.9-684.9); mixed 778.5 us (band 770.8-786.2) vs default [32, 16] 1033.5 us (band '
              '1025.8-1041.2); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    ('v7x', 128, 'bfloat16', 'bfloat16', 32, 4, 128, 32768):
        Entry(128, 8, 'modeled v7x: decode 1365.2 us (band 1365.2-1365.2) vs default [1, 16] 1365.2 us (band '
              '1365.2-1365.2); mixed 1363.7 us (band 1356.0-1509.9) vs default [32, 16] 1490.9 us (band '
              '1483.2-1498.6); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    ('v7x', 128, 'bfloat16', 'bfloat16', 16, 8, 256, 32768):
        Entry(128, 8, 'modeled v7x: decode 174.3 us (band 174.3-174.3) vs default [1, 9] 195.5 us (band '
              '195.5-195.5); mixed 289.4 us (band 281.7-297.1) vs default [32, 10] 456.6 us (band '
              '448.9-464.3); compiled yes (libtpu 0.0.52, 2026-12-06)'),
    ('v7x', 128, 'bfloat16', 'bfloat16', 16, 2, 512, 32768):
        Entry(128, 8, 'modeled v7x: decode 2726.9 us (band 2726.9-2726.9) vs default [1, 16] 2726.9 us (band '
              '2726.9-2726.9); mixed 2692.8 us (band 2685.1-2700.5) vs default [32, 16] 2947.8 us (band '
              '2940.1-2955.5); compiled yes (libtpu 0.0.52, 2026-12-06)'),
}
