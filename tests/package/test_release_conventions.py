"""kernels 0.19 conventions in every release kernel-hub publishes: symbols.json (listed in HF kernels' digest, left out
of kernel-hub's bundle), `kernels-minver`, and `python-depends` inside the list HF kernels accepts; then PyPI kernels
0.19.1's own command line and loaders against our repos published to `kernel-hub serve` (loopback): describe-api,
variants, info, lock + download, get_kernel, LockedLayerRepository, verify-signature."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from kernel_hub.package import buildfmt as fmt
from kernel_hub.publish.release import build_layout
from tests.hub_interop import KERNELS
from tests.hub_server import hub_env

MOE_REPO = "kernel-hub/ragged-dot-tpu"
NORM_REPO = "kernel-hub/rms-norm-tpu"
#: published by the interop_hub fixture (tests/conftest.py)
INTEROP_KERNELS = {MOE_REPO: KERNELS / "ragged_dot", NORM_REPO: KERNELS / "rms_norm"}
TORCH_VARIANTS = ("torch-cpu", "torch-cuda", "torch-tpu")


@pytest.fixture(scope="module")
def layouts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name in ("ragged_dot", "rms_norm", "flash_attention"):
        out[name] = build_layout(KERNELS / name, tmp_path_factory.mktemp(name)).root
    return out


def test_symbols_json_lists_what_the_build_exports(layouts) -> None:
    """The functions symbols.json lists (read from source) are exactly the callables the imported torch build's
    __all__ gives, minus classes and modules; the layers are its `layers` classes."""
    import inspect

    import kernel_hub as kh

    for name, root in layouts.items():
        module = kh.get_local_kernel(KERNELS / name, framework="torch")
        expected = sorted(n for n in module.__all__ if callable(getattr(module, n))
                          and not inspect.isclass(getattr(module, n)) and not inspect.ismodule(getattr(module, n)))
        layer_classes = sorted(n for n, c in vars(module.layers).items()
                               if inspect.isclass(c) and c.__module__ == module.layers.__name__
                               and "forward" in vars(c) and "__init__" not in vars(c))
        symbols = json.loads((root / "build" / "torch-cpu" / "symbols.json").read_text())
        assert symbols["schema_version"] == 1
        assert [f["name"] for f in symbols["functions"]] == expected, name
        assert sorted(layer["name"] for layer in symbols["layers"]) == layer_classes, name
        for layer in symbols["layers"]:
            cls = getattr(module.layers, layer["name"])
            assert layer["attributes"] == {"has_backward": cls.has_backward,
                                           "can_torch_compile": cls.can_torch_compile}
    rd = {f["name"]: f for f in json.loads(
        (layouts["ragged_dot"] / "build" / "torch-cpu" / "symbols.json").read_text())["functions"]}
    assert rd["ragged_dot"]["signature"].startswith("(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes")


def test_symbols_json_is_in_the_digest_and_not_in_the_bundle(layouts) -> None:
    import base64
    import hashlib

    for root in layouts.values():
        for variant in TORCH_VARIANTS:
            vdir = root / "build" / variant
            meta = json.loads((vdir / "metadata.json").read_text())
            digest = base64.b64encode(hashlib.sha256((vdir / "symbols.json").read_bytes()).digest()).decode()
            assert meta["digest"]["files"]["symbols.json"] == digest
            assert "symbols.json" not in meta["kernel-hub"]["sha256"]  # our own section: the package only
            with tarfile.open(root / "build" / f"{variant}.tar") as tar:  # what kernel-hub downloads
                assert "symbols.json" not in tar.getnames()
        assert not list(root.glob("build/jax-*/symbols.json"))  # JAX builds: bundles only, no HF kernels view


def test_minver_and_python_depends_are_what_kernels_accepts(layouts) -> None:
    """Every torch variant: kernels-minver is the installed kernels 0.19.1 (MinverValidator passes) and the
    python-depends pass kernels' own dependency validator for the variant's backend."""
    kernels = pytest.importorskip("kernels")
    from kernels._internals.python_deps import validate_dependencies

    for root in layouts.values():
        for variant in TORCH_VARIANTS:
            meta = json.loads((root / "build" / variant / "metadata.json").read_text())
            assert meta["kernels-minver"] == kernels.__version__ == "0.19.1"
            validate_dependencies(meta["name"], meta["python-depends"], SimpleNamespace(name=meta["backend"]["type"]))
            # jax and torch-tpu are outside kernels' list: they cannot be declared (README says so)
            assert meta["python-depends"] == []


def test_python_depends_splits_by_kernels_own_list() -> None:
    pytest.importorskip("kernels")
    allowed = fmt.kernels_allowed_depends()
    assert "einops" in allowed["general"] and not allowed["backends"].get("tpu")  # nothing TPU-specific
    requires = (("torch", ">=2.6"), ("jax", ">=0.10"), ("einops", ">=0.8"), ("nvidia-cutlass-dsl", ">=4"))
    assert fmt.python_depends(requires, "tpu", allowed) == (["einops"], ["jax", "nvidia-cutlass-dsl"])
    assert fmt.python_depends(requires, "cuda", allowed) == (["einops", "nvidia-cutlass-dsl"], ["jax"])
    # a package name maps to kernels' dependency name (apache-tvm-ffi is declared as tvm-ffi)
    assert fmt.python_depends((("apache-tvm-ffi", ">=0.1"),), "cpu", allowed) == (["tvm-ffi"], [])
    assert fmt.python_depends(requires, "tpu", {}) == ([], ["einops", "jax", "nvidia-cutlass-dsl"])


# -- PyPI kernels 0.19.1 against kernel-hub serve -------------------------------------------------------------


def _kernels(interop_hub, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = hub_env(interop_hub.server, interop_hub.root / "cli-cache")
    return subprocess.run([str(Path(sys.executable).with_name("kernels")), *args], env=env, capture_output=True,
                          text=True, timeout=300, cwd=cwd)


def test_kernels_describe_api_reads_our_symbols(interop_hub) -> None:
    proc = _kernels(interop_hub, "describe-api", MOE_REPO, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    info = json.loads(proc.stdout)
    assert info["repo_id"] == MOE_REPO and info["variant"] == "torch-cpu" and info["revision"] == "v1"
    names = [f["name"] for f in info["functions"]]
    assert "ragged_dot" in names and "moe_experts" in names and "layers" not in names
    assert {"name": "MegaBlocksMoeMLP", "attributes": {"has_backward": True, "can_torch_compile": False}} in info[
        "layers"]
    text = _kernels(interop_hub, "describe-api", NORM_REPO)
    assert text.returncode == 0 and "RMSNorm  has_backward=True  can_torch_compile=False" in text.stdout


def test_kernels_info_and_variants(interop_hub) -> None:
    proc = _kernels(interop_hub, "info", MOE_REPO, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    info = json.loads(proc.stdout)
    assert info["kernels_minver"] == "0.19.1" and info["python_depends"] == [] and info["variant"] == "torch-cpu"
    proc = _kernels(interop_hub, "variants", MOE_REPO, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    [rev] = json.loads(proc.stdout)["revisions"]
    by_name = {v["variant"]: v for v in rev["variants"]}
    assert by_name["torch-cpu"]["compatible"] and by_name["torch-cpu"]["preferred"]
    assert not by_name["torch-tpu"]["compatible"] and not by_name["torch-cuda"]["compatible"]


def test_kernels_lock_download_and_locked_layer(interop_hub, tmp_path: Path) -> None:
    """`kernels lock` pins our repo, `kernels download` fetches and verifies it, and a LockedLayerRepository
    kernelizes a marked RMSNorm onto our layer from that lock, with the numbers of the layer it replaced."""
    (tmp_path / "pyproject.toml").write_text(f'[tool.kernels.dependencies]\n"{NORM_REPO}" = 1\n')
    proc = _kernels(interop_hub, "lock", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    [lock] = json.loads((tmp_path / "kernels.lock").read_text())
    commit = interop_hub.results[NORM_REPO].commit
    assert lock == {"dependency": {"repo-id": NORM_REPO, "version": 1}, "lock": {"commit": commit}}
    proc = _kernels(interop_hub, "download", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    script = """
import json, torch
from pathlib import Path
from kernels import LockedLayerRepository, Mode, kernelize, use_kernel_forward_from_hub, use_kernel_mapping

@use_kernel_forward_from_hub("RMSNorm")
class Norm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, 64))
        self.variance_epsilon = 1e-6
    def forward(self, x):
        v = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(v + self.variance_epsilon)).to(x.dtype)

m = Norm()
x = torch.randn(5, 64, generator=torch.Generator().manual_seed(0))
ref = m(x)
repo = LockedLayerRepository(repo_id=REPO, lockfile=Path(LOCK), layer_name="RMSNorm")
with use_kernel_mapping({"RMSNorm": {"cpu": repo}}):
    kernelize(m, mode=Mode.INFERENCE, device="cpu")
got = m(x)
print(json.dumps({"module": m.forward.__func__.__module__,
                  "err": (got - ref).abs().max().item()}))
"""
    out = interop_hub.run(script, REPO=NORM_REPO, LOCK=str(tmp_path / "kernels.lock"))
    assert out["module"].endswith(".layers"), out
    assert out["err"] < 1e-6, out


def test_kernels_verify_signature_on_our_unsigned_release(interop_hub) -> None:
    """Our releases carry no metadata.json.sigstore: with sigstore installed kernels reports "not signed"; without
    it (this environment) it refuses to verify at all. Either way it never says verified."""
    proc = _kernels(interop_hub, "verify-signature", MOE_REPO, "1")
    assert proc.returncode == 1
    said = proc.stdout + proc.stderr
    assert "requires the `sigstore` package" in said or "not signed" in said, said[-2000:]


# -- signing: what `kernel-hub info` says -----------------------------------------------------------------------


def test_signature_status_decisions() -> None:
    from kernel_hub.package.signing import signature_status

    status = signature_status(None, b"{}", verifier=None)
    assert status.state == "not signed" and "Rekor" in status.reason and "identity" in status.reason
    assert signature_status(b"{}", b"{}", verifier=None).state == "unverifiable"

    def refuses(bundle: bytes, metadata: bytes) -> str:
        raise ValueError("signature does not match\nsecond line")

    bad = signature_status(b"{}", b"{}", verifier=refuses)
    assert bad.state == "invalid" and bad.reason.endswith("signature does not match"), bad
    seen = []

    def accepts(bundle: bytes, metadata: bytes) -> str:
        seen.append((bundle, metadata))
        return "https://github.com/acme/kernels/.github/workflows/build.yaml@refs/heads/main"

    good = signature_status(b"B", b"M", verifier=accepts)
    assert good.state == "verified" and good.identity.startswith("https://github.com/acme/") and seen == [(b"B", b"M")]
    assert signature_status(b"B", None, verifier=accepts).state == "invalid"  # nothing to verify it against
    assert signature_status(b"x" * ((1 << 20) + 1), b"M", verifier=accepts).state == "invalid"


def test_info_shows_each_variant_signed_or_not(tmp_path: Path) -> None:
    """A release whose torch-cpu variant carries a metadata.json.sigstore and whose other variants do not: `info`
    says which, and why ours are unsigned; the bundle here is not a valid Sigstore bundle, so with the sigstore
    package installed it is "invalid", without it (this environment) "unverifiable", never "verified"."""
    import importlib.util

    from huggingface_hub import HfApi

    from tests.hub_server import cli_command, running_server

    token, repo = "sign-token", "acme/toy-signed"
    layout = build_layout(Path(__file__).parents[1] / "fixtures" / "toy_kernel", tmp_path / "out")
    (layout.root / "build" / "torch-cpu" / "metadata.json.sigstore").write_text('{"mediaType": "not a bundle"}')
    with running_server(tmp_path / "store", token=token) as srv:
        api = HfApi(endpoint=srv.url, token=token)
        api.create_repo(repo, repo_type="kernel")
        commit = api.upload_folder(repo_id=repo, repo_type="kernel", folder_path=layout.root).oid
        api.create_tag(repo, tag="v1.2.0", revision=commit, repo_type="kernel")
        api.create_branch(repo, branch="v1", revision=commit, repo_type="kernel")
        env = hub_env(srv, tmp_path / "cli-cache")
        proc = subprocess.run([*cli_command(), "info", repo, "--json"], env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        states = {v["name"]: v["signature"]["state"] for v in json.loads(proc.stdout)["variants"]}
        text = subprocess.run([*cli_command(), "info", repo], env=env, capture_output=True, text=True, timeout=300)
    expected = "invalid" if importlib.util.find_spec("sigstore") else "unverifiable"
    assert states.pop("torch-cpu") == expected
    assert set(states.values()) == {"not signed"} and "jax-cpu" in states, states
    assert text.returncode == 0, text.stderr[-2000:]
    assert f"torch-cpu {expected}" in text.stdout and "kernel-hub publish does not sign" in text.stdout, text.stdout


def test_symbols_of_a_hostile_package_fail_in_one_line_or_list_nothing_outside(tmp_path: Path) -> None:
    """symbols.json is read from source, never run: a file that is not Python fails with one MetadataError naming
    it; `from ..x import` reaching outside the package and names bound only outside it are left out."""
    from kernel_hub.errors import MetadataError
    from kernel_hub.package.symbols import build_symbols

    files = {}
    for rel, text in {"entry.py": "from .impl import *\nfrom ..outside import secret\nfrom os import path\n"
                                  "__all__ = ['run', 'secret', 'path', 'CONST', 'Thing', 'made']\nCONST = 1\n"
                                  "made = factory()\nclass Thing:\n    pass\n",
                      "impl.py": "def run(x, *, scale: float = 1.0):\n    '''Scale x.'''\n    return x\n",
                      "bad.py": "def broken(:\n"}.items():
        files[rel] = tmp_path / rel
        files[rel].write_text(text)
    symbols = build_symbols(files, "entry.py")
    assert symbols["functions"] == [
        {"name": "made", "signature": None, "doc": None},
        {"name": "run", "signature": "(x, *, scale: float=1.0)", "doc": "Scale x."}]
    assert symbols["layers"] == []
    files["entry.py"].write_text("from .bad import broken\n__all__ = ['broken']\n")
    with pytest.raises(MetadataError, match=r"^bad.py: not valid Python") as exc:
        build_symbols(files, "entry.py")
    assert "\n" not in str(exc.value)
