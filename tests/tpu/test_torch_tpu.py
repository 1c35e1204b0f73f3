"""TorchTPU for real: the torch-tpu builds register the Pallas kernels through torch_tpu's own jax_op.

The checks against the real torch_tpu run in the TPU environment (.venv-tpu: torch 2.13, torch-tpu 0.2, jax 0.10.2,
libtpu), which kernel-hub drives in subprocesses: tests/tpu_env/torch_tpu_checks.py under its pytest (registration,
schemas, fake tensors, opcheck parts, autograd, v5e/v6e compiles, kernelize), and HF `kernels` loading our published
repos from `kernel-hub serve` under its Python. They skip, with the reason, only where that environment is missing
(`make test` creates it). The rest runs here, where torch_tpu is not installed.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kernel_hub.package.metadata import load_metadata

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
CHECKS = ROOT / "tests" / "tpu_env" / "torch_tpu_checks.py"
HF_SCRIPT = ROOT / "tests" / "tpu_env" / "hf_kernels_torch_tpu.py"
TOKEN = "test-token"
KERNELS = {"ragged_dot": "kernel-hub/ragged-dot-tpu", "flash_attention": "kernel-hub/flash-attention-tpu",
           "rms_norm": "kernel-hub/rms-norm-tpu"}
#: Every check in CHECKS: each must have run and passed (none skipped, none forgotten).
TPU_ENV_CHECKS = (
    "test_every_entry_is_registered_with_its_schema",
    "test_a_second_import_reuses_the_ops_and_another_version_registers_its_own",
    "test_fake_kernels_give_the_contract_shapes_and_dtypes",
    "test_gradients_flow_through_the_registered_backward_ops",
    "test_opcheck_parts_that_run_on_meta_tensors",
    "test_opcheck_on_real_tensors_needs_a_tpu",
    "test_registered_functions_compile_for_v5e_and_v6e",
    "test_ragged_dot_runs_through_the_registered_op_and_its_autograd",
    "test_moe_experts_composes_two_ragged_dots_through_the_registered_op",
    "test_quantized_weights_run_through_the_registered_quantized_op_and_its_autograd",
    "test_an_expert_parallel_op_registers_with_its_mesh_and_partition_specs",
    "test_cpu_tensors_run_the_cpu_path_and_say_so",
    "test_torch_cpu_build_never_imports_torch_tpu_although_it_is_installed",
    "test_kernelize_for_tpu_picks_the_torch_tpu_build_and_says_it_is_not_validated",
    "test_device_kind_falls_back_when_torch_tpu_names_no_chip",
    "test_rms_norm_registers_its_ops_and_they_compile_for_v5e_and_v6e",
)


def _namespace_pattern(kernel: str) -> str:
    """A namespace of this kernel's kernel.yaml version with any content digest (builds loaded elsewhere)."""
    version = load_metadata(ROOT / "kernels/pallas" / kernel).version
    return re.escape(f"kernel_hub_{kernel}_v{version.replace('.', '_2e')}_c") + "[0-9a-f]{16}"


def _namespace(kernel: str, package_dir: Path) -> str:
    """What the op namespace must be, computed here: the version with '.' as _2e, and the package's file digest."""
    version = load_metadata(ROOT / "kernels/pallas" / kernel).version
    assert re.fullmatch(r"[0-9.]+", version)
    digest = hashlib.sha256()
    for path in sorted(p for p in package_dir.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        rel, data = path.relative_to(package_dir).as_posix().encode(), path.read_bytes()
        digest.update(b"%d:%s%d:" % (len(rel), rel, len(data)) + data)
    return f"kernel_hub_{kernel}_v{version.replace('.', '_2e')}_c{digest.hexdigest()[:16]}"


@pytest.fixture(scope="module")
def env(tpu_environment):
    return tpu_environment


def _child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(TF_CPP_MIN_LOG_LEVEL="3", ALLOW_MULTIPLE_LIBTPU_LOAD="1", **extra)
    env["PYTHONPATH"] = str(ROOT / "src") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


# ---- here, without torch_tpu -------------------------------------------------------------------------------------

@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_op_names_carry_the_kernel_yaml_version(kernel):
    import kernel_hub as kh

    module = kh.get_kernel(KERNELS[kernel], framework="torch", backend="cpu")
    version = importlib.import_module(f"{module.__name__}.release").VERSION
    assert version == load_metadata(ROOT / "kernels/pallas" / kernel).version
    ops = importlib.import_module(f"{module.__name__}._vendor.torch_tpu_ops")
    package_dir = Path(module.__file__).parent
    expected = _namespace(kernel, package_dir)
    assert ops.op_namespace(kernel, version, ops.package_digest(package_dir)) == expected
    assert f"{expected}::{kernel}" in module.describe("tpu")


def test_op_namespace_is_one_per_version_and_content_and_refuses_what_is_not_a_name(tmp_path):
    import kernel_hub as kh

    module = kh.get_kernel(KERNELS["ragged_dot"], framework="torch", backend="cpu")
    ops = importlib.import_module(f"{module.__name__}._vendor.torch_tpu_ops")
    d = "0123456789abcdef" * 4
    assert ops.op_namespace("ragged_dot", "1.1.0", d) == "kernel_hub_ragged_dot_v1_2e1_2e0_c0123456789abcdef"
    assert ops.op_namespace("ragged_dot", "1.1.0", d) != ops.op_namespace("ragged_dot", "1.1.1", d)
    confusable = ("1.2.0", "1.2-0", "1_2_0", "1.2+0", "1.2.0RC1", "1.2.0rc1")
    assert len({ops.op_namespace("ragged_dot", v, d) for v in confusable}) == len(confusable)
    assert all(re.fullmatch(r"[a-z0-9_]+", ops.op_namespace("ragged_dot", v, d)) for v in confusable)
    # two copies of one build differing in one byte: two digests, two namespaces; an equal copy shares them
    package = Path(module.__file__).parent
    first, second, same = (tmp_path / n / package.name for n in ("a", "b", "c"))
    for copy in (first, second, same):
        shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    ops_file = second / "torch_api.py"
    data = bytearray(ops_file.read_bytes())
    data[-1] ^= 1
    ops_file.write_bytes(bytes(data))
    digests = [ops.package_digest(p) for p in (first, second, same)]
    assert digests[0] != digests[1] and digests[0] == digests[2]
    assert ops.op_namespace("ragged_dot", "1.2.0", digests[0]) != ops.op_namespace("ragged_dot", "1.2.0", digests[1])
    for kernel, version, digest in (("Ragged-Dot", "1.0.0", d), ("ragged_dot", "1.0.0::x", d), ("ragged_dot", "", d),
                                    ("ragged_dot", "1.0.0", "xyz"), ("ragged_dot", "1.0.0", "")):
        with pytest.raises(ValueError):
            ops.op_namespace(kernel, version, digest)


def test_where_torch_tpu_is_absent_the_torch_tpu_build_is_not_chosen_and_kernelize_says_why():
    import kernel_hub as kh
    from kernel_hub.errors import KernelHubError
    from kernel_hub.layers.api import is_kernelized

    assert importlib.util.find_spec("torch_tpu") is None  # the main environment has no TorchTPU
    with pytest.raises(KernelHubError, match=r"torch-tpu>=0\.2,<0\.3"):
        kh.get_kernel(KERNELS["ragged_dot"], framework="torch", backend="tpu")
    module = kh.get_kernel(KERNELS["ragged_dot"], framework="torch", backend="cpu")
    ops = importlib.import_module(f"{module.__name__}._vendor.torch_tpu_ops")
    with pytest.raises(ops.TorchTpuUnavailableError, match="install torch-tpu"):
        ops.jax_op()

    from tests.tiny_models import tiny_model

    model = tiny_model("qwen3_moe")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = kh.kernelize_report(kh.kernelize(model, device="tpu"))
    assert report.backend == "tpu" and not report.replaced and len(report.kept) == 2
    assert all("torch-tpu" in k.reason and "did not load" in k.reason for k in report.kept)
    assert not is_kernelized(model)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_kernelize_refuses_a_device_torch_does_not_know():
    import kernel_hub as kh
    from kernel_hub.errors import KernelHubError
    from tests.tiny_models import tiny_model

    with pytest.raises(KernelHubError, match="'warp:0' is not a device torch knows"):
        kh.kernelize(tiny_model("qwen3_moe"), device="warp:0")


# ---- in the TPU environment, against the real torch_tpu -----------------------------------------------------------

def test_torch_tpu_checks_pass_in_the_tpu_environment(env, tmp_path):
    facts_path = tmp_path / "facts.json"
    # its own --basetemp: with the default one, the inner session's exit clears out older numbered
    # /tmp/pytest-of-<user> folders (earlier runs' wheel venvs among them, gigabytes) inside this test
    done = subprocess.run(
        [str(env.python), "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "--basetemp",
         str(tmp_path / "basetemp"), str(CHECKS)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
        env=_child_env(KERNEL_HUB_TORCH_TPU_FACTS=str(facts_path)),
    )
    tail = "\n".join(line for line in done.stdout.splitlines() if not line.startswith(("I0000", "W0000")))[-4000:]
    assert done.returncode == 0, tail
    passed = set(re.findall(r"^PASSED \S+::(\w+)", done.stdout, flags=re.M))
    assert passed == set(TPU_ENV_CHECKS), tail

    facts = json.loads(facts_path.read_text())
    ragged = {op.split("::")[0] for op in facts["ops"] if op.endswith("::ragged_dot")}
    flash = {op.split("::")[0] for op in facts["ops"] if op.endswith("::flash_attention")}
    assert len(ragged) == len(flash) == 1, facts["ops"]  # one build of each, whatever the digest
    [ragged_ns], [flash_ns] = ragged, flash
    assert re.fullmatch(_namespace_pattern("ragged_dot"), ragged_ns), ragged_ns
    assert re.fullmatch(_namespace_pattern("flash_attention"), flash_ns), flash_ns
    assert set(facts["ops"]) >= {f"{ragged_ns}::ragged_dot", f"{ragged_ns}::ragged_dot_backward",
                                 f"{ragged_ns}::ragged_dot_quantized", f"{ragged_ns}::ragged_dot_quantized_backward",
                                 f"{flash_ns}::flash_attention", f"{flash_ns}::flash_attention_backward",
                                 f"{flash_ns}::decode_attention"}
    first, other = facts["ops"]["versions_in_one_process"]
    assert first == f"{ragged_ns}::ragged_dot"
    assert re.fullmatch(r"kernel_hub_ragged_dot_v9_2e9_2e0_c[0-9a-f]{16}::ragged_dot", other), other
    compiled = {(" ".join(c["case"].split()[:2]), c["generation"]) for c in facts["compile"]}
    for op in ("ragged_dot fwd", "ragged_dot bwd", "ragged_dot_quantized fwd", "ragged_dot_quantized bwd",
               "flash_attention fwd", "flash_attention bwd", "decode_attention bf16"):
        assert {(op, "v5e"), (op, "v6e")} <= compiled, op
    assert {c["device_kind"] for c in facts["compile"]} == {"TPU v5 lite", "TPU v6 lite"}
    assert {c["case"].split()[2] for c in facts["compile"] if c["case"].startswith("ragged_dot_quantized fwd")} == {
        "int8", "fp8"}
    assert facts["quantized"]["moe_calls"] == ["quantized_forward"] * 2
    assert max(max(e) for e in facts["quantized"]["errors"].values()) <= 1e-4
    assert {(c["case"].split()[1], c["generation"]) for c in facts["rms_norm"]} == {
        (p, g) for p in ("fwd", "bwd") for g in ("v5e", "v6e")}
    for entry in ("ragged_dot", "ragged_dot_quantized", "flash_attention", "decode_attention"):
        assert "test_aot_dispatch_dynamic" in facts["opcheck"][entry]["refused"]
    assert facts["kernelize"]["row"]["variant"] == "torch-tpu"
    assert facts["kernelize"]["row"]["not_validated"].startswith("not validated: needs a TPU")


def test_hf_kernels_loads_the_torch_tpu_builds_from_serve(env, tmp_path):
    pytest.importorskip("starlette")
    from kernel_hub.publish.release import publish
    from tests.hub_server import hub_env, running_server

    repos = {"ragged_dot": "acme/ragged-dot-tpu", "flash_attention": "acme/flash-attention-tpu"}
    with running_server(tmp_path / "store", token=TOKEN, extra_args=("--trusted-org", "acme")) as server:
        for kernel, repo in repos.items():  # numbers are the kernels' own tests' business; this is about loading
            result = publish(ROOT / "kernels/pallas" / kernel, repo_id=repo, endpoint=server.url, token=TOKEN,
                             skip_validation=True, skip_tpu_compile=True, log=lambda _: None)
            assert "torch-tpu" in result.variants
        child = hub_env(server, tmp_path / "hf-cache", TF_CPP_MIN_LOG_LEVEL="3", ALLOW_MULTIPLE_LIBTPU_LOAD="1")
        done = subprocess.run([str(env.python), str(HF_SCRIPT), repos["ragged_dot"], repos["flash_attention"]],
                              capture_output=True, text=True, timeout=300, env=child, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    # no TPU here: HF kernels' own detection says cpu and takes the torch-cpu build
    assert facts["backend_here"] == "cpu" and "/build/torch-cpu/" in Path(facts["file_here"]).as_posix()
    # as on a TPU host: the torch-tpu builds, their ops registered through torch_tpu's jax_op
    assert facts["backend_tpu"] == "tpu"
    assert all("/build/torch-tpu/" in Path(f).as_posix() for f in facts["files"])
    assert {"ragged_dot", "moe_experts", "flash_attention", "decode_attention", "tpu_ops"} <= set(facts["exports"])
    for op, (kernel, entry) in zip(facts["ops"], [("flash_attention", "decode_attention"),
                                                  ("flash_attention", "flash_attention"),
                                                  ("flash_attention", "ragged_paged_attention"),
                                                  ("ragged_dot", "experts_forward"),
                                                  ("ragged_dot", "experts_forward_bias"),
                                                  ("ragged_dot", "ragged_dot"),
                                                  ("ragged_dot", "ragged_dot_quantized")], strict=True):
        assert re.fullmatch(_namespace_pattern(kernel) + f"::{entry}", op), op
    assert facts["meta_out"] == [[300, 384], "torch.float32"]
    # CPU tensors: the CPU path runs (numbers right) and each entry says so once
    assert facts["cpu_error"] <= 1e-5 and facts["cpu_attention_shape"] == [1, 4, 5, 16]
    assert [w.split(" of ")[0] for w in facts["cpu_warnings"]] == ["ragged_dot", "flash_attention"]
    assert all("not on a TPU" in w and "tensor.to('tpu')" in w for w in facts["cpu_warnings"])
    assert facts["last_implementation"][0] == "torch"
