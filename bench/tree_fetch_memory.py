"""Peak memory of fetching a kernel-builder tree build: it should grow with the largest file, not the build.

Starts `kernel-hub serve` on a free loopback port, publishes one `build/torch-cpu/` tree holding FILES source files of
SIZE MiB each, then fetches it (download, verify, unpack; nothing imported) in a fresh process and reads that
process's resident memory from /proc before and after (VmRSS, VmHWM). Prints one JSON line: the build's bytes, the
largest file, and the peak resident growth during the fetch. Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the test server harness (tests/hub_server.py) is checkout gear, like bench/

from tests.hub_server import hub_env, running_server  # noqa: E402

TOKEN = "bench-token"
FETCH = """
import json
from kernel_hub.api import plan_load
from kernel_hub.sources.hub.source import HubSource

def kib(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])

plan = plan_load("acme/big-tree", version=1, framework="torch", backend="cpu", source=HubSource())
before = kib("VmRSS")
open("/proc/self/clear_refs", "w").write("5")
plan.download()
print(json.dumps({"rss_before_mib": before / 1024, "peak_growth_mib": (kib("VmHWM") - before) / 1024}))
"""


def run(files: int, size_mib: int) -> dict:
    from huggingface_hub import HfApi

    from tests.kernel_builder_repo import publish, relu_files, write_variant

    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        package = relu_files("big") | {f"blob{i}.py": "#" + os.urandom(size_mib << 19).hex() + "\n"
                                       for i in range(files)}
        write_variant(tmp / "repo", "torch-cpu", "big-tree", package)
        with running_server(tmp / "store", token=TOKEN) as server:
            publish(HfApi(endpoint=server.url, token=TOKEN), "acme/big-tree", tmp / "repo")
            done = subprocess.run([sys.executable, "-c", FETCH], capture_output=True, text=True, timeout=600,
                                  env=hub_env(server, tmp / "cache", PYTHONPATH=str(ROOT / "src")))
        if done.returncode != 0:
            raise SystemExit(done.stderr[-2000:])
        measured = json.loads(done.stdout.strip().splitlines()[-1])
    return {"files": files, "file_mib": size_mib, "build_mib": files * size_mib, **measured}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--size-mib", type=int, default=24)
    args = parser.parse_args()
    print(json.dumps(run(args.files, args.size_mib)))


if __name__ == "__main__":
    main()
