"""The report's benches: each bench/*.py run in its own process with small settings, its JSON read back.

A fresh process per bench keeps JAX's and torch's thread pools from contending (a torch call right after a JAX
call in one process ran 1.5-3.5x slower) and one bench's memory from the next. Every bench writes the shared
form (timing.bench_records: group, method, samples and their spread, ratio to the baseline with its IQR) or,
for benches without repeated timings (hub loads, the TPU cost model), plain rows.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..package.checkout import checkout_root
from ..ui.progress import Progress
from ..verify.timing import format_ratio
from .schema import Bench, BenchRecord

#: The checkout's bench/ folder; None when kernel_hub runs installed (benches ship with a checkout only).
BENCH_DIR: Path | None = _root / "bench" if (_root := checkout_root()) is not None else None
#: A bench that runs longer than this is stopped and reported as failed.
TIMEOUT_S = 900


@dataclass(frozen=True)
class BenchSpec:
    name: str
    script: str  # under bench/
    args: tuple[str, ...]  # the report's settings (quick ones for --quick)
    quick_args: tuple[str, ...]
    needs_tpu_env: bool = False


_CALIBRATION_ROWS = ",".join(
    [f"v5e-matmul-128-{n}" for n in (1024, 4096, 8192)] + [f"v5e-matmul-512x1024x1024-{n}" for n in (1024, 4096, 8192)]
    + [f"v5e-xla-matmul-{n}" for n in (1024, 4096, 8192)])

BENCHES = (
    BenchSpec("ragged_dot", "ragged_dot.py", ("--quick",), ("--quick", "--shapes", "pallas_small_e8")),
    BenchSpec("attention", "attention.py", ("--quick",), ("--quick", "--repeats", "3")),
    BenchSpec("moe_decode", "moe_decode.py", ("--quick", "--dtypes", "bf16"), ("--quick", "--dtypes", "bf16")),
    BenchSpec("diffusers_attention", "diffusers_attention.py", ("--quick",), ("--quick", "--tokens", "64")),
    BenchSpec("hub_loads", "hub_loads.py", (), ()),
    BenchSpec("tpu_model", "tpu_model.py", (), (), needs_tpu_env=True),
    # the full table (3 generations, both models, both phases) is `python bench/tpu_peers.py`; the report's run
    # stays within TIMEOUT_S: Qwen3-30B-A3B decode and attention on v5e
    BenchSpec("tpu_peers", "tpu_peers.py", ("--quick",), ("--quick",), needs_tpu_env=True),
    # the cost model against published measured TPU times (bench/records/tpu_calibration.json); the report runs
    # the v5e rows (seconds); `python bench/tpu_calibration.py` runs every row (RPA v3 at 128/256 sequences: minutes)
    BenchSpec("tpu_calibration", "tpu_calibration.py", ("--rows", _CALIBRATION_ROWS), ("--rows", _CALIBRATION_ROWS),
              needs_tpu_env=True),
)
#: Benches in a quick report (the test's): the cheapest one with plots.
QUICK_BENCHES = ("ragged_dot",)


def parse(name: str, script: str, data: dict, seconds: float) -> Bench:
    """A bench's JSON as the report's Bench: records in the shared form, other rows as they are."""
    ours = set(data.get("ours") or ())
    records = [BenchRecord(**{k: r[k] for k in BenchRecord.model_fields if k in r and k != "ours"},
                           ours=r["method"] in ours) for r in data.get("records", [])]
    return Bench(name=name, script=script, ok=True, error=None, seconds=seconds, baseline=data.get("baseline"),
                 records=records, rows=list(data.get("rows", [])))


def run_bench(spec: BenchSpec, *, quick: bool, bench_dir: Path | None = BENCH_DIR) -> Bench:
    script = bench_dir / spec.script if bench_dir is not None else None
    label = f"bench/{spec.script}"
    failed = dict(name=spec.name, script=label, ok=False, baseline=None, records=[], rows=[])
    if script is None or not script.is_file():
        return Bench(**failed, error="not found (benches ship with a checkout of kernel-hub, not the wheel)",
                     seconds=0.0)
    if spec.needs_tpu_env:
        from ..tpu.env import TpuEnvironmentError, tpu_env

        try:
            tpu_env()
        except TpuEnvironmentError as exc:
            return Bench(**failed, error=str(exc), seconds=0.0)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kernel-hub-bench-") as tmp:
        out = Path(tmp) / "out.json"
        cmd = [sys.executable, str(script), *(spec.quick_args if quick else spec.args), "--out", str(out)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=tmp)
        except subprocess.TimeoutExpired:
            return Bench(**failed, error=f"timed out after {TIMEOUT_S} s", seconds=time.perf_counter() - start)
        seconds = time.perf_counter() - start
        if done.returncode != 0 or not out.is_file():
            tail = [ln.strip() for ln in (done.stderr or done.stdout).splitlines() if ln.strip()][-1:]
            return Bench(**failed, error=f"exit {done.returncode}: {' '.join(tail)[:300]}", seconds=seconds)
        return parse(spec.name, label, json.loads(out.read_text()), seconds)


def summary(bench: Bench) -> str:
    """One line per bench for the live rows: each of our methods' best ratio against the baseline."""
    if not bench.ok:
        return f"  FAIL  bench {bench.name:<22} {bench.error}"
    ours = [r for r in bench.records if r.ours and r.vs_baseline]
    if not ours:
        return f"  done  bench {bench.name:<22} {len(bench.rows)} rows in {bench.seconds:.0f} s"
    parts = [f"{r.group}: {r.method} {format_ratio(r.vs_baseline)}" for r in ours]
    return f"  done  bench {bench.name:<22} vs {bench.baseline}: " + "; ".join(parts)


def run_benches(*, quick: bool, progress: Progress, only: tuple[str, ...] | None = None) -> list[Bench]:
    wanted = only or (QUICK_BENCHES if quick else None)
    specs = [s for s in BENCHES if not wanted or s.name in wanted]
    progress.phase("benches", len(specs))
    out = []
    for spec in specs:
        bench = run_bench(spec, quick=quick)
        out.append(bench)
        progress.row(summary(bench), ok=bench.ok)
        progress.advance()
    return out
