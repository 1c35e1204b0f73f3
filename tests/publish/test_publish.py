"""`kernel-hub publish`: the HF kernels-compatible layout, validation gate, tags and branches, re-publish rules."""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub")
pytest.importorskip("starlette")

from huggingface_hub import HfApi

from kernel_hub.errors import KernelHubError, ValidationFailedError
from kernel_hub.publish.release import build_layout, publish
from tests.hub_server import cli_command, hub_env
from tests.toy_folder import TOY, copy_toy

TOKEN = "test-token"


def quiet(_: str) -> None:
    pass


def test_layout_is_hf_kernels_compatible(tmp_path: Path) -> None:
    from kernels._rust import Digest, DigestAlgorithm, Metadata

    layout = build_layout(TOY, tmp_path / "out")
    files = set(layout.files)
    assert {"build/jax-cpu.tar", "build/jax-tpu.tar", "build/torch-cpu.tar", "kernel.yaml", "README.md"} <= files
    assert "build/torch-cpu/metadata.json" in files and "build/torch-cpu/toy_scale/__init__.py" in files
    assert not any(p.startswith(("build/jax-cpu/", "build/jax-tpu/")) for p in files)  # HF kernels never sees them
    variant = tmp_path / "out" / "build" / "torch-cpu"
    meta = Metadata.read_from_file(variant / "metadata.json")
    assert str(meta.name) == "toy-scale" and meta.version == 1
    meta.digest.validate(Digest.hash_variant(DigestAlgorithm.SHA256, variant))  # raises on any mismatch
    # The torch entry became the package __init__.
    assert (variant / "toy_scale" / "__init__.py").read_text() == (TOY / "toy_scale" / "torch_entry.py").read_text()
    # Bundles are reproducible: same files, same bytes (so an identical re-publish uploads nothing).
    build_layout(TOY, tmp_path / "again")
    for name in ("jax-cpu", "torch-cpu"):
        a = (tmp_path / "out" / "build" / f"{name}.tar").read_bytes()
        assert a == (tmp_path / "again" / "build" / f"{name}.tar").read_bytes()
    with tarfile.open(tmp_path / "out" / "build" / "jax-cpu.tar") as tar:
        names = tar.getnames()
    assert "metadata.json" in names and "toy_scale/ops.py" in names and "toy_scale/validation.py" in names


def test_publish_tags_and_moves_the_major_branch(server, tmp_path: Path) -> None:
    repo = "acme/pub"
    api = HfApi(endpoint=server.url, token=TOKEN)
    first = publish(copy_toy(tmp_path / "a", "1.2.0"), repo_id=repo, endpoint=server.url, token=TOKEN,
                    skip_tpu_compile=True, log=quiet)
    assert first.validated and first.branch_moved and first.tag == "v1.2.0"
    second = publish(copy_toy(tmp_path / "b", "1.3.0", "\n# 1.3.0\n"), repo_id=repo, endpoint=server.url,
                     token=TOKEN, skip_validation=True, skip_tpu_compile=True, log=quiet)
    older = publish(copy_toy(tmp_path / "c", "1.2.1", "\n# 1.2.1\n"), repo_id=repo, endpoint=server.url,
                    token=TOKEN, skip_validation=True, skip_tpu_compile=True, log=quiet)
    assert not older.branch_moved  # v1 keeps the newest 1.x
    refs = api.list_repo_refs(repo, repo_type="kernel")
    tags = {t.name: t.target_commit for t in refs.tags}
    assert tags == {"v1.2.0": first.commit, "v1.3.0": second.commit, "v1.2.1": older.commit}
    assert {b.name: b.target_commit for b in refs.branches}["v1"] == second.commit
    # The git store agrees: tags are annotated git tags.
    git_dir = server.store / "kernels" / "acme" / "pub.git"
    kind = subprocess.run(["git", "--git-dir", str(git_dir), "cat-file", "-t", "v1.3.0"], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert kind == "tag"


def test_republish_same_content_is_a_noop_and_different_content_refused(server, tmp_path: Path) -> None:
    repo = "acme/republish"
    one = publish(copy_toy(tmp_path / "a"), repo_id=repo, endpoint=server.url, token=TOKEN, skip_validation=True,
                  skip_tpu_compile=True, log=quiet)
    server.reset()
    same = publish(copy_toy(tmp_path / "b"), repo_id=repo, endpoint=server.url, token=TOKEN, skip_validation=True,
                   skip_tpu_compile=True, log=quiet)
    assert same.unchanged and same.commit == one.commit
    assert not [r for r in server.requests() if r[0] == "POST" and "/commit/" in r[1]]
    with pytest.raises(KernelHubError, match="already published with different content"):
        publish(copy_toy(tmp_path / "c", ops_extra="\n# changed\n"), repo_id=repo, endpoint=server.url, token=TOKEN,
                skip_validation=True, skip_tpu_compile=True, log=quiet)


def test_failing_kernel_is_refused_unless_skip_validation_says_so(server, tmp_path: Path) -> None:
    broken = copy_toy(tmp_path / "broken", "2.0.0", "\n_good = scale\n\n\ndef scale(x, factor=2.0):\n"
                 "    return _good(x, factor) + 1\n")
    with pytest.raises(ValidationFailedError, match="fails validation"):
        publish(broken, repo_id="acme/broken", endpoint=server.url, token=TOKEN, skip_tpu_compile=True, log=quiet)
    assert not (server.store / "kernels" / "acme" / "broken.git").exists()  # refused before any upload
    proc = subprocess.run([*cli_command(), "publish", str(broken), "--repo", "acme/broken", "--skip-validation",
                           "--skip-tpu-compile"],
                          env=hub_env(server, tmp_path / "cache", HF_TOKEN=TOKEN), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "skipping validation (--skip-validation)" in proc.stdout
    assert "published acme/broken v2.0.0" in proc.stdout


def test_publish_cli_errors_are_one_line(server, tmp_path: Path) -> None:
    env = hub_env(server, tmp_path / "cache", HF_TOKEN="wrong")
    proc = subprocess.run([*cli_command(), "publish", str(TOY), "--repo", "acme/x", "--skip-validation",
                           "--skip-tpu-compile"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and server.url in lines[0] and "401" in lines[0], proc.stderr
    proc = subprocess.run([*cli_command(), "publish", str(tmp_path / "nowhere"), "--skip-validation",
                           "--skip-tpu-compile"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1


def test_metadata_json_carries_the_release(tmp_path: Path) -> None:
    layout = build_layout(TOY, tmp_path)
    meta = json.loads((layout.root / "build" / "torch-cpu" / "metadata.json").read_text())
    assert meta["kernel-hub"]["version"] == "1.2.0"
    assert meta["kernel-hub"]["variant"]["entry"] == "__init__.py"
    # HF kernels' digest: the package's files (what kernel-hub verifies) plus symbols.json beside it
    assert set(meta["digest"]["files"]) == {*meta["kernel-hub"]["sha256"], "symbols.json"}
