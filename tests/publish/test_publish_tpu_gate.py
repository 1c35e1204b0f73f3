"""The publish gate: a TPU variant is published only when every TPU compile case of its kernel compiles (the real
TPU compiler, libtpu in .venv-tpu) for every generation it declares; the release records the matrix and
`kernel-hub info` shows it. Small toy Pallas kernels (two cases, v5e and v6e) keep it fast.
"""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub")
pytest.importorskip("starlette")

from huggingface_hub import HfApi

from kernel_hub.decide.variants import Variant
from kernel_hub.errors import IntegrityError
from kernel_hub.package import buildfmt as fmt
from kernel_hub.publish.release import build_layout, publish
from kernel_hub.publish.tpu_gate import CompileGateError, gate_plan
from kernel_hub.tpu.compile_gate import gate
from kernel_hub.tpu.env import TpuEnvironmentError
from tests.hub_server import cli_command, hub_env
from tests.tpu_toys import env_or_skip, write_package

TOKEN = "gate-token"

KERNEL_YAML = """\
name: toy_pallas
repo_id: acme/toy-pallas
version: {version}
description: Doubles an array in a Pallas kernel; exists for the publish gate tests.
license: Apache-2.0
python_name: toy_pallas
variants:
  - name: jax-tpu
    framework: jax
    backend: tpu
    tpu_generations: [v5e, v6e]
    requires: {{jax: ">=0.10"}}
  - name: jax-cpu
    framework: jax
    backend: cpu
    requires: {{jax: ">=0.10"}}
"""

OPS = '''
import jax
from jax.experimental import pallas as pl


def _kernel(x_ref, o_ref):
    o_ref[...] = {body}


def double(x, *, interpret=None):
    mode = jax.default_backend() != "tpu" if interpret is None else interpret
    return pl.pallas_call(_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=mode)(x)
'''
GOOD = "x_ref[...] * 2"
#: Works in interpret mode, but Mosaic refuses the shape cast (lanes not a multiple of 128): a kernel that
#: passes every CPU test and would fail on a TPU.
BAD = "(x_ref[...].reshape(x_ref.shape[0] * x_ref.shape[1]) * 2).reshape(x_ref.shape)"

CASES = '''
def _build(shape, dtype):
    def build():
        import jax

        from .ops import double

        return (lambda x: double(x, interpret=False)), (jax.ShapeDtypeStruct(shape, dtype),)

    return build


def compile_cases():
    return [CompileCase("double:8x100:f32", "float32", ("smoke",), _build((8, 100), "float32")),
            CompileCase("double:16x128:bf16", "bfloat16", (), _build((16, 128), "bfloat16"))]
'''


def toy_pallas(dest: Path, body: str = GOOD, version: str = "1.0.0") -> Path:
    write_package(dest / "toy_pallas", {"__init__.py": 'from .ops import double\n\n__all__ = ["double"]\n',
                                        "ops.py": OPS.format(body=body), "tpu_cases.py": CASES})
    (dest / "kernel.yaml").write_text(KERNEL_YAML.format(version=version))
    return dest


@pytest.fixture(scope="module")
def env():
    return env_or_skip()


@pytest.fixture
def compile_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KERNEL_HUB_CACHE", str(tmp_path / "kh-cache"))
    return tmp_path / "kh-cache"


def published_metadata(server, repo: str, tag: str, variant: str, tmp_path: Path) -> dict:
    """metadata.json inside the variant's bundle, as published."""
    api = HfApi(endpoint=server.url, token=TOKEN)
    bundle = api.hf_hub_download(repo, fmt.bundle_path(variant), repo_type=fmt.REPO_TYPE, revision=tag,
                                 cache_dir=tmp_path / "hf")
    with tarfile.open(bundle) as tar:
        member = tar.extractfile("metadata.json")
        assert member is not None
        return json.load(io.TextIOWrapper(member))


def cli(server, tmp_path: Path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([*cli_command(), *args], env=hub_env(server, tmp_path / "cli-cache", HF_TOKEN=TOKEN, **extra),
                          capture_output=True, text=True, timeout=300)


def test_gate_plan_compiles_each_declared_generation_once() -> None:
    variants = [Variant("jax-tpu", "jax", "tpu", tpu_generations=("v6e", "v5e")),
                Variant("torch-tpu", "torch", "tpu", tpu_generations=("v5p",)),
                Variant("jax-cpu", "jax", "cpu")]
    generations, per = gate_plan(variants)
    assert generations == ("v5e", "v5p", "v6e")  # kernel-hub's order, whatever kernel.yaml's
    assert per == {"jax-tpu": ("v6e", "v5e"), "torch-tpu": ("v5p",)}
    generations, per = gate_plan([Variant("jax-tpu", "jax", "tpu")])  # none declared: it claims every generation
    assert generations == ("v4", "v5e", "v5p", "v6e", "v7x") and per["jax-tpu"] == generations
    assert gate_plan([Variant("jax-cpu", "jax", "cpu")]) == ((), {})
    with pytest.raises(CompileGateError, match="v3 has no compiler target"):
        gate_plan([Variant("jax-tpu", "jax", "tpu", tpu_generations=("v3",))])


def test_a_variant_that_does_not_compile_is_refused(env, server, compile_cache, tmp_path: Path) -> None:
    bad = toy_pallas(tmp_path / "bad", BAD)
    with pytest.raises(CompileGateError) as exc:
        publish(bad, repo_id="acme/toy-bad", endpoint=server.url, token=TOKEN, skip_validation=True, log=print)
    message = str(exc.value)
    assert "\n" not in message
    assert "jax-tpu does not compile for TPU v5e: double:8x100:f32: Mosaic failed to compile TPU kernel" in message
    assert "not publishing (--skip-tpu-compile overrides)" in message
    assert not (server.store / "kernels" / "acme" / "toy-bad.git").exists()  # refused before any upload


def test_publish_records_the_compile_matrix_and_info_shows_it(env, server, compile_cache, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    good = toy_pallas(tmp_path / "good")
    lines: list[str] = []
    result = publish(good, repo_id="acme/toy-good", endpoint=server.url, token=TOKEN, skip_validation=True,
                     log=lines.append)
    assert any(line.startswith("compiled jax-tpu for TPU v5e,v6e: 2 cases x 2 generations all compiled")
               for line in lines), lines
    meta = published_metadata(server, "acme/toy-good", result.tag, "jax-tpu", tmp_path)
    record = meta["kernel-hub"]["tpu_compile"]
    assert record["status"] == "compiled" and record["generations"] == ["v5e", "v6e"]
    assert (record["jax"], record["libtpu"]) == (env.jax_version, env.libtpu_version)
    assert record["cases"] == 2 and record["compiled"] == 4 and record["failed"] == []
    for gen in ("v5e", "v6e"):
        assert record["per_generation"][gen] == {"cases": 2, "compiled": 2, "implementations": {"default": 2}}
    cpu = published_metadata(server, "acme/toy-good", result.tag, "jax-cpu", tmp_path)
    assert "tpu_compile" not in cpu["kernel-hub"]  # only TPU variants carry a record

    proc = cli(server, tmp_path, "info", "acme/toy-good")
    assert proc.returncode == 0, proc.stderr
    assert f"jax-tpu      compiled for TPU v5e,v6e: 4/4 (2 cases x 2 generations) with jax {env.jax_version}, " \
           f"libtpu {env.libtpu_version}" in proc.stdout, proc.stdout
    assert "v5e  2/2 compiled" in proc.stdout and "v6e  2/2 compiled" in proc.stdout

    def no_compiler(*args, **kwargs):
        raise AssertionError("compiled again although the package content is unchanged")

    monkeypatch.setattr(gate, "compile_in_worker", no_compiler)
    # the same release again from a fresh compile cache: found published before anything is compiled
    monkeypatch.setenv("KERNEL_HUB_CACHE", str(tmp_path / "fresh-cache"))
    same = publish(toy_pallas(tmp_path / "same"), repo_id="acme/toy-good", endpoint=server.url, token=TOKEN,
                   skip_validation=True, log=lambda _: None)
    assert same.unchanged and same.commit == result.commit

    # the same kernel code again (a new version): served from the compile cache, no compiler started
    monkeypatch.setenv("KERNEL_HUB_CACHE", str(compile_cache))
    again = toy_pallas(tmp_path / "again", version="1.0.1")
    lines.clear()
    publish(again, repo_id="acme/toy-good", endpoint=server.url, token=TOKEN, skip_validation=True, log=lines.append)
    assert any("0 s of compiling, 4 cached" in line for line in lines), lines


def test_missing_tpu_environment_refuses_tpu_variants_in_one_line(server, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = toy_pallas(tmp_path / "k")
    monkeypatch.setenv("KERNEL_HUB_TPU_PYTHON", str(tmp_path / "no-python"))
    with pytest.raises(TpuEnvironmentError) as exc:
        publish(kernel, repo_id="acme/toy-noenv", endpoint=server.url, token=TOKEN, skip_validation=True,
                log=lambda _: None)
    message = str(exc.value)
    assert "\n" not in message and "jax-tpu must compile for TPU" in message
    assert "kernel-hub setup-tpu" in message and "--skip-tpu-compile" in message
    proc = cli(server, tmp_path, "publish", str(kernel), "--repo", "acme/toy-noenv", "--skip-validation",
               KERNEL_HUB_TPU_PYTHON=str(tmp_path / "no-python"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "kernel-hub setup-tpu" in proc.stderr, proc.stderr
    assert not (server.store / "kernels" / "acme" / "toy-noenv.git").exists()


def test_skip_flag_is_announced_and_recorded_as_not_compiled(server, tmp_path: Path) -> None:
    kernel = toy_pallas(tmp_path / "k", BAD)  # would fail the gate: the flag is what lets it through
    proc = cli(server, tmp_path, "publish", str(kernel), "--repo", "acme/toy-skip", "--skip-validation",
               "--skip-tpu-compile", KERNEL_HUB_TPU_PYTHON=str(tmp_path / "no-python"))
    assert proc.returncode == 0, proc.stderr
    assert "skipping the TPU compile gate (--skip-tpu-compile): jax-tpu published marked 'not compiled for TPU'" \
        in proc.stdout
    record = published_metadata(server, "acme/toy-skip", "v1.0.0", "jax-tpu", tmp_path)["kernel-hub"]["tpu_compile"]
    assert record["status"] == "not compiled" and "--skip-tpu-compile" in record["reason"]
    info = cli(server, tmp_path, "info", "acme/toy-skip")
    assert info.returncode == 0, info.stderr
    assert "jax-tpu      not compiled for TPU (published with --skip-tpu-compile)" in info.stdout, info.stdout


def test_a_release_without_a_record_and_a_malformed_record(tmp_path: Path) -> None:
    layout = build_layout(toy_pallas(tmp_path / "k"), tmp_path / "out")  # no gate ran: no record
    folder = tmp_path / "unpacked"
    fmt.unpack_bundle(layout.root / fmt.bundle_path("jax-tpu"), folder, "test")
    assert fmt.read_build_info(folder, "test", "jax-tpu").tpu_compile is None
    data = json.loads((folder / "metadata.json").read_text())
    for bad in ({"status": "compiled", "generations": ["../v5e"]}, {"status": "maybe"}, "compiled",
                {"status": "compiled", "cases": -1}, {"status": "compiled", "libtpu": "0.0.52; rm -rf /"}):
        data["kernel-hub"]["tpu_compile"] = bad
        with pytest.raises(IntegrityError, match="metadata.json tpu_compile") as exc:
            fmt.parse_build_info(data, "acme/x [jax-tpu]", "jax-tpu")
        assert "\n" not in str(exc.value)
