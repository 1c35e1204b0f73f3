"""transformers' own model tests, run twice per model family: as transformers ships them (baseline) and with every
model they build kernelized by kernel-hub (kernelize_plugin.py). Not part of the default test suite: a family takes
tens of minutes on two cores.

Where the tests come from (the transformers wheel ships none):
- tests/*.py (the common mixins: ModelTesterMixin, the pipeline, training, tensor-parallel ones) from the sdist of
  the installed transformers version (`pip download transformers==<installed> --no-binary :all:`), so the mixins
  that exercise most of the library are the installed version's own;
- everything else under tests/ (causal_lm_tester.py, generation/test_utils.py, exporters/, utils/,
  models/<family>/) and utils/test_module from a transformers git tree at `--commit`: the sdist has none of them.
  Which commit is the caller's choice; the one used for docs/hf-interop.md is named there.
- names the older tree expects and the installed library dropped are set by tf_compat_plugin.py from that tree's
  own transformers source (`compat.json`), in both runs alike; tests/distributed_testing_utils.py, which is in
  neither source, is a stand-in that raises when called (those tests fail in both runs, never skip).

Usage:
  python tests/interop/hf_model_tests/run.py --mirror <transformers git dir> --work /tmp/tf-tests \\
      [--families qwen3_moe llama ...] [--modes baseline kernelized] [--summarize-only]

Then: one pytest per family and mode (HF_HUB_OFFLINE=1, -p no:cacheprovider, transformers' own skips and `slow`
markers as they are, RUN_SLOW unset), junit XML and the plugin's per-test record under <work>/runs/, and the
summary (`--record`, default bench/records/hf_model_tests.json): per family the tests run, passed in each mode, and
the tests that fail only kernelized.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
FAMILIES = ("qwen3_moe", "llama", "mixtral", "gpt_oss", "olmoe", "qwen2_moe")
DEFAULT_COMMIT = "2b296305d7bcf040831661b7b689e13a2e2e8d67"
STAND_IN = '''"""Stand-in written by kernel-hub's run.py: this module is in no source used here; calls raise."""


def _missing(*args, **kwargs):
    raise RuntimeError("tests/distributed_testing_utils.py is not available in this run")


run_distributed = _get_distributed_backend = _get_distributed_device_type = _missing
_get_rank_device = _set_rank_device = _start_rank_processes = _missing
'''


def _git(mirror: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(mirror), *args], check=True, capture_output=True, text=True).stdout


def installed_version() -> str:
    from importlib.metadata import version

    return version("transformers")


def build_tree(mirror: Path, commit: str, work: Path, sdist: Path | None) -> None:
    """The test tree at `work`: the git tree's tests/ and utils/test_module, the sdist's tests/*.py over them, the
    stand-in, compat.json, and src/transformers linked to the installed library (test_pipeline_mixin reads it)."""
    work.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(mirror), "archive", commit, "tests", "utils/test_module",
                              "conftest.py", "pyproject.toml"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)
    if sdist is None:
        dl = work / "sdist"
        subprocess.run([sys.executable, "-m", "pip", "download", f"transformers=={installed_version()}",
                        "--no-binary", ":all:", "--no-deps", "--no-build-isolation", "-d", str(dl)], check=True)
        sdist = next(dl.glob("transformers-*.tar.gz"))
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if len(parts) == 3 and parts[1] == "tests" and parts[2].endswith(".py"):
                member.name = f"tests/{parts[2]}"
                tar.extract(member, work, filter="data")
    (work / "tests" / "distributed_testing_utils.py").write_text(STAND_IN)
    (work / "src").mkdir(exist_ok=True)
    link = work / "src" / "transformers"
    if not link.exists():
        import transformers

        link.symlink_to(Path(transformers.__file__).parent)
    (work / "compat.json").write_text(json.dumps(compat_names(mirror, commit), indent=1))


def compat_names(mirror: Path, commit: str) -> dict:
    """The tester defaults (`*_DEFAULTS` in testing_utils) and `PreTrainedModel._is_stateful` as the git tree's own
    transformers source defines them: literals read with ast, never executed."""
    out: dict = {"testing_utils": {}, "PreTrainedModel": {}}
    for node in ast.parse(_git(mirror, "show", f"{commit}:src/transformers/testing_utils.py")).body:
        if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id.endswith("_DEFAULTS")):
            out["testing_utils"][node.targets[0].id] = ast.literal_eval(node.value)
    for node in ast.parse(_git(mirror, "show", f"{commit}:src/transformers/modeling_utils.py")).body:
        if isinstance(node, ast.ClassDef) and node.name == "PreTrainedModel":
            for stmt in node.body:
                if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                        and stmt.target.id == "_is_stateful"):
                    out["PreTrainedModel"]["_is_stateful"] = ast.literal_eval(stmt.value)
    return out


def run_family(work: Path, family: str, mode: str, deps: Path, timeout: int, keyword: str | None = None) -> int:
    runs = work / "runs"
    runs.mkdir(exist_ok=True)
    env = dict(os.environ, KH_TF_COMPAT=str(work / "compat.json"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_HUB_DISABLE_UPDATE_CHECK="1", KH_KERNELIZE_RECORD=str(runs / f"{mode}-{family}-record.json"),
               PYTHONPATH=os.pathsep.join([str(deps), str(HERE), str(ROOT / "src")]))
    env.pop("RUN_SLOW", None)
    plugins = ["-p", "tf_compat_plugin"] + (["-p", "kernelize_plugin"] if mode == "kernelized" else [])
    cmd = ["timeout", "-s", "INT", str(timeout), sys.executable, "-m", "pytest", *plugins, "-p", "no:cacheprovider",
           "-q", "-o", "log_cli=false", f"--junitxml={runs / f'{mode}-{family}.xml'}",
           *(["-k", keyword] if keyword else []), f"tests/models/{family}/test_modeling_{family}.py"]
    with open(runs / f"{mode}-{family}.log", "w") as log:
        return subprocess.run(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT).returncode


def outcomes(xml: Path) -> dict[str, str]:
    """test id -> passed / failed / skipped from a junit file; a test with any failing part is failed."""
    rank = {"passed": 0, "skipped": 1, "failed": 2}
    out: dict[str, str] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}".split("[")[0]
        tags = {child.tag for child in case}
        now = "failed" if tags & {"failure", "error"} else "skipped" if "skipped" in tags else "passed"
        if rank[now] >= rank.get(out.get(name, "passed"), 0):
            out[name] = now
    return out


def _merged(runs: Path, mode: str, family: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for xml in sorted(runs.glob(f"{mode}*-{family}.xml")):
        out.update(outcomes(xml))
    return out


def summarize(work: Path, families: list[str]) -> dict:
    runs = work / "runs"
    table = {}
    for family in families:
        # <mode>*-<family>.xml: a run may be split in parts over disjoint tests (kernelized-b-<family>.xml)
        base, kern, record = _merged(runs, "baseline", family), _merged(runs, "kernelized", family), {}
        if not (base and kern):
            continue
        for path in sorted(runs.glob(f"kernelized*-{family}-record.json")):
            record.update(json.loads(path.read_text()))
        on_kernelized = sum(1 for r in record.values() if r.get("models", 0) > 0)
        # a run cut short (timeout sends SIGINT, so pytest still writes its XML) compares the tests both reached
        ran = sorted(t for t in base if base[t] != "skipped" and t in kern)
        table[family] = {
            "collected": len(base),
            "reached_kernelized": len(kern),
            "ran": len(ran),
            "passed_baseline": sum(base[t] == "passed" for t in ran),
            "passed_kernelized": sum(kern.get(t) == "passed" for t in ran),
            "tests_on_kernelized_models": on_kernelized,
            "layers_swapped": sum(r.get("replaced", 0) for r in record.values()),
            "kernelized_only_failures": sorted(t for t in ran if base[t] == "passed" and kern.get(t) == "failed"),
            "baseline_only_failures": sorted(t for t in ran if base[t] == "failed" and kern.get(t) == "passed"),
        }
    return table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--mirror", type=Path, help="a transformers git directory holding --commit")
    ap.add_argument("--commit", default=DEFAULT_COMMIT, help="the git tree's commit for tests/ (default: %(default)s)")
    ap.add_argument("--sdist", type=Path, help="transformers-<installed>.tar.gz (default: pip download it)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/tf-tests"), help="the test tree and runs/")
    ap.add_argument("--deps", type=Path, default=Path("/tmp/tf-deps"),
                    help="pip --target folder for the tests' own imports (httpx, parameterized)")
    ap.add_argument("--families", nargs="+", default=list(FAMILIES))
    ap.add_argument("--modes", nargs="+", default=["baseline", "kernelized"], choices=["baseline", "kernelized"])
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per family and mode")
    ap.add_argument("--keyword", help="pytest -k expression: only these tests (default: every test of the file)")
    ap.add_argument("--summarize-only", action="store_true", help="only read <work>/runs into --record")
    ap.add_argument("--record", type=Path, default=ROOT / "bench" / "records" / "hf_model_tests.json")
    args = ap.parse_args(argv)
    if not args.summarize_only:
        if args.mirror is None:
            ap.error("--mirror is needed to build the test tree")
        build_tree(args.mirror, args.commit, args.work, args.sdist)
        if not args.deps.exists():
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(args.deps), "httpx",
                            "parameterized"], check=True)
        for family in args.families:
            for mode in args.modes:
                rc = run_family(args.work, family, mode, args.deps, args.timeout, args.keyword)
                print(f"{family} {mode}: pytest exit {rc}", flush=True)
    table = summarize(args.work, args.families)
    record = {"transformers": installed_version(), "tests_commit": args.commit, "families": table}
    args.record.write_text(json.dumps(record, indent=1) + "\n")
    for family, row in table.items():
        print(f"{family}: ran {row['ran']}, passed baseline {row['passed_baseline']}, kernelized "
              f"{row['passed_kernelized']}, kernelized-only failures {len(row['kernelized_only_failures'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
