"""First load and cached load of each kernel-builder layout, for the closing note (test gear, not collected:
`PYTHONPATH=src .venv/bin/python -m tests.kernel_builder_timing`). Each load runs in a fresh process against a
`kernel-hub serve` on loopback; the time is kh.get_kernel's alone (torch imported before the clock starts); the
cached load is a new process with HF_HUB_OFFLINE=1 on the warm cache. The clock starts after `import torch,
kernel_hub.api, huggingface_hub.hf_api` (a fixed cost of any load, either dialect: printed below the table).
Prints a Markdown table (medians of `repeats` fresh caches)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from huggingface_hub import HfApi

from kernel_hub.api import plan_load
from kernel_hub.sources.hub.source import HubSource
from tests.hub_server import hub_env, running_server
from tests.kernel_builder_repo import arch_repo, publish, relu_files, write_variant

ROOT = Path(__file__).resolve().parents[1]
CHILD = ("import json, sys, time, torch\nt0 = time.perf_counter()\nimport kernel_hub as kh\nimport kernel_hub.api\n"
         "import huggingface_hub.hf_api\nt = time.perf_counter()\n"
         "m = kh.get_kernel(sys.argv[1], version=1, framework='torch', backend='cpu', trust_remote_code=True)\n"
         "print(json.dumps({'s': time.perf_counter() - t, 'imports': t - t0, 'variant': m.__kernel_hub__.variant,"
         " 'verified': m.__kernel_hub__.verified}))\n")


def main(repeats: int = 3) -> None:
    root = Path(tempfile.mkdtemp(prefix="kb-timing-"))
    layouts = {"package (build/V/<name>/)": "acme/t-package", "root (build/V/ itself)": "acme/t-root",
               "zip (build/V/<id>.zip)": "acme/t-zip", "arch names (6 variants)": "acme/t-arch",
               "package, no digest": "acme/t-nodigest"}
    with running_server(root / "store", token="t") as srv:
        api = HfApi(endpoint=srv.url, token="t")
        write_variant(root / "p", "torch-cpu", "kb-relu", relu_files("p"))
        write_variant(root / "r", "torch-universal", "kb-relu", relu_files("r"), layout="root")
        write_variant(root / "z", "torch-cpu", "kb-relu", relu_files("z"), layout="zip")
        write_variant(root / "n", "torch-cpu", "kb-relu", relu_files("n"), digest=False)
        for folder, repo in zip(("p", "r", "z", "arch", "n"), layouts.values(), strict=True):
            publish(api, repo, arch_repo(root / folder) if folder == "arch" else root / folder)
        imports: list[float] = []
        rows = ["| layout | variant here (cpu) | on a simulated TPU | verified | first load | cached load |",
                "|---|---|---|---|---|---|"]
        for label, repo in layouts.items():
            tpu = plan_load(repo, version=1, framework="torch", backend="tpu",
                            source=HubSource(endpoint=srv.url, cache_dir=root / "sim")).choice.variant
            first, cached, facts = [], [], {}
            for i in range(repeats):
                cache = root / f"cache-{repo.split('/')[1]}-{i}"
                for offline, out in (("0", first), ("1", cached)):
                    env = hub_env(srv, cache, HF_HUB_OFFLINE=offline, PYTHONPATH=str(ROOT / "src"),
                                  KERNEL_HUB_CACHE=str(cache / "kh"))
                    done = subprocess.run([sys.executable, "-c", CHILD, repo], capture_output=True, text=True,
                                          env=env, timeout=120, check=True)
                    facts = json.loads(done.stdout.strip().splitlines()[-1])
                    out.append(facts["s"])
                    imports.append(facts["imports"])
            rows.append(f"| {label} | {facts['variant']} | {tpu.name if tpu else 'none fits'} | {facts['verified']} "
                        f"| {statistics.median(first) * 1e3:.0f} ms | {statistics.median(cached) * 1e3:.0f} ms |")
    print("\n".join(rows))
    print(f"imports before the clock (torch excluded): median {statistics.median(imports) * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
