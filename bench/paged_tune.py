"""The ragged paged attention's tuned table (flash_attention/paged_tuned_table.py), made: per generation, model
geometry (Qwen3-30B-A3B 32/4 x 128, Gemma 4 26B-A4B sliding 16/8 x 256 window 1024 and global 16/2 x 512; pages of
128, bf16) and length bucket (positions per sequence), pages_per_block (8, 16, 32) swept on the decode batch (64
sequences of one new token over the bucket) and (block_q in 8 .. 512) x pages_per_block on the mixed batch (4
prefill chunks of 496 tokens beside 60 decode steps), each candidate read by kernel-hub's TPU cost model (modeled,
with its band, not measured), skipping candidates whose VMEM estimate passes the chip's budget; the blocks the
kernel would pick without a table (the VMEM-safe fallback) are modeled beside them. The pages per step that decode
fastest (ties: the best mixed), the block_q that runs the mixed batch fastest with them, are then compiled by libtpu
for the generation (decode and mixed); a row whose blocks both compile is a table entry.

    python bench/paged_tune.py [--generations v5e,v6e,v7x] [--lengths 8192] [--json]   # sweep (minutes a row)
    python bench/paged_tune.py --table bench/records/paged_tune.json                    # the table's entries
    python bench/paged_tune.py --generations v6e --lengths 8192 --json --merge bench/records/paged_tune.json
        # one generation's rows into the record, the others kept (--rows FILE: an earlier --in-tpu-env run's rows)

Runs in the TPU environment (make setup-tpu), in a subprocess of it; `--in-tpu-env` runs the sweep in this process
(one JSON line per row on stdout, progress on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = (8, 16, 32)
BLOCK_Q = (8, 16, 32, 64, 128, 256, 512)
PAGE, BATCH, PREFILLS, CHUNK, PREFILL_CONTEXT = 128, 64, 4, 496, 4096


def batch(phase: str, length: int) -> list[tuple[int, int]]:
    """(new tokens, length including them) per sequence: decode steps over `length` positions, and for "mixed" 4 of
    them replaced by prefill chunks of 496 tokens over min(4096, length)."""
    decode = [(1, length)] * (BATCH - (PREFILLS if phase == "mixed" else 0))
    return decode + ([(CHUNK, min(PREFILL_CONTEXT, length))] * PREFILLS if phase == "mixed" else [])


def pick_pages(decode: dict[int, list[float]], mixed: dict[tuple[int, int], list[float]], default: int) -> int | None:
    """Pages per step: the fastest on the decode batch (the common step); among those within 0.5% of it (the model
    often times them alike), the one whose best mixed time is fastest, the default's blocks on a tie."""
    if not decode:
        return None
    best = min(t[0] for t in decode.values())
    near = [p for p, t in decode.items() if t[0] <= best * 1.005]
    mixed_best = {p: min((t[0] for (_, pp), t in mixed.items() if pp == p), default=float("inf")) for p in near}
    return min(near, key=lambda p: (mixed_best[p], decode[p][0], p != default))


def _log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def sweep(generations: list[str], lengths: list[int], pages_grid: tuple[int, ...] = PAGES,
          block_q_grid: tuple[int, ...] = BLOCK_Q) -> None:
    """Runs inside the TPU environment: one JSON line per (generation, geometry, length). The default's blocks are
    always among the candidates, whatever grids are given."""
    import importlib
    import math

    import jax
    import numpy as np

    from kernel_hub.tpu.chips import chip
    from kernel_hub.tpu.package import folder_package
    from kernel_hub.tpu.target import on_device, topology_devices
    from kernel_hub.tpu.worker_common import load_package
    from tpu_cost_model import paged_peers as pp
    from tpu_cost_model.schedule import kernel_cost

    fa = load_package(folder_package(ROOT / "kernels/pallas/flash_attention").request())
    cfg_mod = importlib.import_module(f"{fa.__name__}.config")
    shapes = importlib.import_module(f"{fa.__name__}._vendor.attention_shapes")
    geos = {g.model: g for g in shapes.ATTENTION_MODELS}
    sds = jax.ShapeDtypeStruct
    for gen in generations:
        c = chip(gen)
        device = topology_devices(c.topology)[0]
        jax.config.update("jax_default_device", device)
        full_budget = cfg_mod.vmem_plan(c.device_kind)[0]
        budget = full_budget * 5 // 8
        for length in lengths:
            pps = length // PAGE
            for model in pp.PAGED_MODELS:
                geo = geos[model]

                def call(phase, block_q, ppb, geo=geo, length=length, pps=pps):
                    seqs = batch(phase, length)
                    q_lens = np.array([q for q, _ in seqs], np.int32)
                    lens = np.array([k for _, k in seqs], np.int32)
                    table = np.arange(len(seqs) * pps, dtype=np.int32).reshape(len(seqs), pps)
                    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
                    tokens, b = int(q_lens.sum()), len(seqs)
                    cache = sds((b * pps, PAGE, geo.hkv, geo.d), "bfloat16")
                    args = (sds((tokens, geo.hq, geo.d), "bfloat16"), sds((tokens, geo.hkv, geo.d), "bfloat16"),
                            sds((tokens, geo.hkv, geo.d), "bfloat16"), cache, cache, lens, table, cu, b)
                    config = fa.AttentionConfig(paged_block_q=block_q, paged_pages_per_block=ppb)

                    def step(q, k, v, kc, vc, lens, table, cu, n, geo=geo, config=config):
                        return fa.ragged_paged_attention(q, k, v, kc, vc, lens, table, cu, n,
                                                         sm_scale=1 / math.sqrt(geo.d), sliding_window=geo.window,
                                                         implementation="pallas", interpret=False, config=config)

                    return jax.jit(step, donate_argnums=(3, 4)), args

                def modeled(phase, block_q, ppb, call=call, gen=gen, c=c, model=model, length=length):
                    t0 = time.perf_counter()
                    fn, args = call(phase, block_q, ppb)
                    cost = kernel_cost(fn, *args, generation=gen)
                    fast, slow = cost.band(c)
                    _log(f"{gen} {model} {length} {phase} block_q {block_q} pages {ppb}: "
                         f"{cost.seconds(c) * 1e6:.1f} us ({time.perf_counter() - t0:.0f} s)")
                    return [round(cost.seconds(c) * 1e6, 1), round(fast * 1e6, 1), round(slow * 1e6, 1)]

                def fits(block_q, ppb, geo=geo, budget=budget):
                    return cfg_mod.paged_step_vmem_bytes(block_q, geo.hq // geo.hkv, ppb * PAGE, geo.hkv, geo.d,
                                                         2) <= budget

                def fallback(phase, geo=geo, length=length, pps=pps, full_budget=full_budget):
                    seqs = batch(phase, length)
                    auto = cfg_mod.paged_blocks(sum(q for q, _ in seqs), len(seqs), geo.hq // geo.hkv, PAGE, pps,
                                                geo.hkv, geo.d, 2, geo.window, full_budget)
                    return auto.block_q, min(auto.pages_per_block, pps)

                fb_decode, fb_mixed = fallback("decode"), fallback("mixed")
                pages = sorted({min(p, pps) for p in pages_grid} | {fb_decode[1], fb_mixed[1]})
                decode = {p: modeled("decode", 1, p) for p in pages if fits(1, p)}
                grid = {(q, p): modeled("mixed", q, p) for p in decode for q in sorted({*block_q_grid, fb_mixed[0]})
                        if fits(q, p)}
                ppb = pick_pages(decode, grid, fb_decode[1])
                mixed = {q: t for (q, p), t in grid.items() if p == ppb}
                block_q = min(mixed, key=lambda q: (mixed[q][0], q != fb_mixed[0]), default=None)
                key = [gen, PAGE, "bfloat16", "bfloat16", geo.hq, geo.hkv, geo.d, length]
                if ppb is None or block_q is None:  # no candidate within the VMEM estimate: no entry (the fallback)
                    print(json.dumps({"model": model, "key": key, "skipped": "no candidate fits the VMEM budget"}),
                          flush=True)
                    continue
                default = {"decode_blocks": list(fb_decode), "mixed_blocks": list(fb_mixed),
                           "decode_us": decode.get(fb_decode[1]) if fb_decode[0] == 1 else None,
                           "mixed_us": grid.get(fb_mixed)}
                if default["decode_us"] is None:
                    default["decode_us"] = modeled("decode", *fb_decode)
                if default["mixed_us"] is None:
                    default["mixed_us"] = modeled("mixed", *fb_mixed)
                compiled = {}
                for phase, bq in (("decode", 1), ("mixed", block_q)):
                    fn, args = call(phase, bq, ppb)
                    abstract = tuple(a if isinstance(a, jax.ShapeDtypeStruct)
                                     else sds(np.shape(a), np.asarray(a).dtype) for a in args)
                    try:
                        fn.lower(*on_device(abstract, device)).compile()
                        compiled[phase] = "yes"
                    except Exception as exc:  # the compiler's refusal is the row
                        compiled[phase] = str(exc).strip().splitlines()[0][:200]
                    _log(f"{gen} {model} {length} {phase} compiled: {compiled[phase]}")
                print(json.dumps({"key": key, "block_q": block_q, "pages_per_block": ppb, "compiled": compiled,
                                  "tuned": {"decode_us": decode[ppb], "mixed_us": mixed[block_q]},
                                  "default": default, "decode_us": decode,
                                  "mixed_us": {f"{q},{p}": t for (q, p), t in grid.items()},
                                  "model": model, "window": geo.window, "libtpu": _libtpu(),
                                  "date": time.strftime("%Y-%m-%d", time.gmtime())}), flush=True)


def _libtpu() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("libtpu")
    except PackageNotFoundError:
        return None


def _us(triple: list[float]) -> str:
    return f"{triple[0]} us (band {triple[1]}-{triple[2]})"


def table_lines(rows: list[dict]) -> list[str]:
    """The table's entries (Python source) from the sweep's rows: compiled rows only, each with where it came from."""
    out = []
    for r in rows:
        if "skipped" in r:
            out += _comment(f"{'/'.join(map(str, r['key']))} ({r['model']}): {r['skipped']}: the fallback")
            continue
        if not all(v == "yes" for v in r["compiled"].values()):
            out += _comment(f"{'/'.join(map(str, r['key']))} ({r['model']}): not compiled {r['compiled']}")
            continue
        t, d = r["tuned"], r["default"]
        origin = (f"modeled {r['key'][0]}: decode {_us(t['decode_us'])} vs default {d['decode_blocks']} "
                  f"{_us(d['decode_us'])}; mixed {_us(t['mixed_us'])} vs default {d['mixed_blocks']} "
                  f"{_us(d['mixed_us'])}; compiled yes (libtpu {r['libtpu']}, {r['date']})")
        head = f"        Entry({r['block_q']}, {r['pages_per_block']}, "
        out.append(f"    {tuple(r['key'])!r}:\n" + head + f"\n{' ' * 14}".join(_chunks(origin, 116 - len(head))) + "),")
    return out


def _comment(text: str) -> list[str]:
    return ["    # " + line for line in textwrap.wrap(text, 114)]


def _chunks(text: str, width: int) -> list[str]:
    """`text` as string literals of at most `width` characters each, split after spaces (implicit concatenation
    gives it back whole), so the table's lines stay within the line length."""
    parts, line = [], ""
    for word in text.split(" "):
        piece = word if not line else line + " " + word
        if line and len(repr(piece + " ")) > width:
            parts.append(repr(line + " "))
            line = word
        else:
            line = piece
    return parts + [repr(line)]


def merged(record: dict, rows: list[dict], command: str) -> dict:
    """`record` with its rows of the generations in `rows` replaced by them (other generations kept), and `command`
    recorded under "commands" for each of those generations: one record for the table, swept a generation at a
    time."""
    gens = {r["key"][0] for r in rows}
    commands = dict(record.get("commands") or {})
    if "command" in record:  # a record of one sweep: its command covers its generations
        for g in {r["key"][0] for r in record["rows"]}:
            commands.setdefault(g, record["command"])
    commands.update({g: command for g in gens})
    kept = [r for r in record["rows"] if r["key"][0] not in gens]
    return {"commands": dict(sorted(commands.items())), "rows": kept + rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generations", default="v5e,v6e,v7x")
    parser.add_argument("--lengths", default="8192", help="length buckets (positions per sequence), comma-separated")
    parser.add_argument("--pages", default=",".join(map(str, PAGES)),
                        help="pages_per_block candidates (the default's are added), comma-separated")
    parser.add_argument("--block-q", default=",".join(map(str, BLOCK_Q)),
                        help="block_q candidates on the mixed batch (the default's is added), comma-separated")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--merge", metavar="RECORD",
                        help="with --json: write the rows into RECORD, replacing its rows of the swept generations")
    parser.add_argument("--rows", metavar="FILE",
                        help="the sweep's rows from an earlier --in-tpu-env run's stdout, instead of sweeping now")
    parser.add_argument("--table", metavar="RECORD", help="print the table's entries from a --json record")
    parser.add_argument("--in-tpu-env", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.table:
        print("\n".join(table_lines(json.loads(Path(args.table).read_text())["rows"])))
        return 0
    gens = [g.strip() for g in args.generations.split(",") if g.strip()]
    lengths = [int(n) for n in args.lengths.split(",") if n.strip()]
    pages_grid = tuple(int(n) for n in args.pages.split(",") if n.strip())
    block_q_grid = tuple(int(n) for n in args.block_q.split(",") if n.strip())
    if args.in_tpu_env:
        sweep(gens, lengths, pages_grid, block_q_grid)
        return 0
    if args.rows:
        rows = [json.loads(ln) for ln in Path(args.rows).read_text().splitlines() if ln.startswith("{")]
        if not rows:
            return 1
    else:
        sys.path.insert(0, str(ROOT / "src"))
        from kernel_hub.tpu.env import tpu_env

        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT / "src"),
               "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
        done = subprocess.run([str(tpu_env().python), __file__, "--in-tpu-env", "--generations", args.generations,
                               "--lengths", args.lengths, "--pages", args.pages, "--block-q", args.block_q],
                              stdout=subprocess.PIPE, text=True, env=env)
        rows = [json.loads(ln) for ln in done.stdout.splitlines() if ln.startswith("{")]
        if done.returncode or not rows:
            return done.returncode or 1
    if args.json:
        command = f"python bench/paged_tune.py --generations {args.generations} --lengths {args.lengths}"
        command += "".join(f" --{name} {value}" for name, value, default in (
            ("pages", args.pages, PAGES), ("block-q", args.block_q, BLOCK_Q)) if value != ",".join(map(str, default)))
        if args.merge:
            record = merged(json.loads(Path(args.merge).read_text()), rows, command)
            Path(args.merge).write_text(json.dumps(record, indent=1) + "\n")
            return 0
        print(json.dumps({"command": command, "rows": rows}, indent=1))
        return 0
    print("\n".join(table_lines(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
