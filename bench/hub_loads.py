"""Requests and wall time of loading a kernel from a Hub server: kernel-hub vs HF `kernels`.

Starts `kernel-hub serve` on a free loopback port, publishes the ragged dot (its torch-cpu build is what HF
`kernels` loads), then runs each load in a fresh process and counts the requests the server saw. Loads:
fresh cache by major version, by range, cached, offline (HF_HUB_OFFLINE=1), locked into a fresh cache, and
locked + cached with the server stopped. Times include the process's imports (torch is imported first,
outside the timed part). Writes bench/out/hub_loads.json (the rows and the environment).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the test server harness (tests/hub_server.py) is checkout gear, like bench/

from json_out import write_result  # noqa: E402

from kernel_hub.publish.release import publish  # noqa: E402
from kernel_hub.report.environment import environment  # noqa: E402
from tests.hub_server import hub_env, hub_requests, running_server  # noqa: E402

REPO = "acme/ragged-dot-tpu"
TOKEN = "bench-token"

PRELUDE = "import time, torch\nt = time.perf_counter()\n"
OURS = PRELUDE + (
    "import kernel_hub as kh\n"
    "m = kh.get_kernel({repo!r}, {how}, framework='torch', backend='cpu', trust_remote_code=True)\n"
    "print(time.perf_counter() - t)\n"
)
LOCKED = PRELUDE + (
    "import kernel_hub as kh\n"
    "m = kh.get_kernel({repo!r}, lockfile={lock!r}, framework='torch', trust_remote_code=True)\n"
    "print(time.perf_counter() - t)\n"
)
THEIRS = PRELUDE + (
    "import kernels\n"
    "m = kernels.get_kernel({repo!r}, version=1)\n"
    "print(time.perf_counter() - t)\n"
)


def _run(code: str, env: dict[str, str]) -> tuple[bool, float | str]:
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        return False, (out.stderr.strip().splitlines() or ["?"])[-1][:160]
    return True, float(out.stdout.strip().splitlines()[-1])


def run() -> dict:
    """Every load, each in a fresh process; the JSON the bench writes."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        lock = tmp / "kernel-hub.lock"
        with running_server(tmp / "store", token=TOKEN) as srv:
            publish(ROOT / "kernels/pallas/ragged_dot", repo_id=REPO, endpoint=srv.url, token=TOKEN,
                    skip_validation=True, skip_tpu_compile=True, log=lambda _: None)

            def measure(who: str, load: str, code: str, cache: Path, **extra: str) -> None:
                srv.reset()
                ok, value = _run(code, hub_env(srv, cache, **extra))
                reqs = hub_requests(srv)
                rows.append({"client": who, "load": load, "ok": ok, "requests": len(reqs),
                             "seconds": value if ok else None, "error": None if ok else value,
                             "calls": [f"{m} {p} {s}" for m, p, s in reqs]})

            theirs, ours = tmp / "hf-cache", tmp / "kh-cache"
            hf = f"HF kernels {importlib.metadata.version('kernels')}"
            measure(hf, "fresh, version=1", THEIRS.format(repo=REPO), theirs)
            measure(hf, "cached, version=1", THEIRS.format(repo=REPO), theirs)
            measure(hf, "cached, offline", THEIRS.format(repo=REPO), theirs, HF_HUB_OFFLINE="1")
            measure("kernel-hub", "fresh, version=1", OURS.format(repo=REPO, how="version=1"), ours)
            measure("kernel-hub", "fresh, version='>=1.0,<2'",
                    OURS.format(repo=REPO, how="version='>=1.0,<2'"), tmp / "kh-cache-2")
            measure("kernel-hub", "cached, version=1", OURS.format(repo=REPO, how="version=1"), ours)
            measure("kernel-hub", "cached, offline", OURS.format(repo=REPO, how="version=1"), ours,
                    HF_HUB_OFFLINE="1")
            env = hub_env(srv, tmp / "kh-cache-lock")
            subprocess.run([sys.executable, "-m", "kernel_hub.cli", "lock", REPO, "--version", "1", "--framework",
                            "torch", "--backend", "cpu", "-o", str(lock), "--trust-remote-code", REPO], env=env,
                           check=True, capture_output=True)
            measure("kernel-hub", "locked, fresh cache", LOCKED.format(repo=REPO, lock=str(lock)), tmp / "kh-3")
            srv.stop()
            ok, value = _run(LOCKED.format(repo=REPO, lock=str(lock)), env)
            rows.append({"client": "kernel-hub", "load": "locked, cached, server stopped", "ok": ok,
                         "requests": 0, "seconds": value if ok else None, "error": None if ok else value})
    return {"benchmark": "hub_loads", "environment": environment(with_libtpu=False).model_dump(), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "bench/out/hub_loads.json"))
    parser.add_argument("--quick", action="store_true", help="accepted for the report; every load runs once anyway")
    args = parser.parse_args(argv)
    result = run()
    rows = result["rows"]
    print(f"{'client':<20}{'load':<34}{'requests':>9}{'seconds':>9}")
    for r in rows:
        secs = f"{r['seconds']:.2f}" if r["ok"] else f"  fails: {r['error'][:70]}"
        print(f"{r['client']:<20}{r['load']:<34}{r['requests']:>9}{secs:>9}")
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
