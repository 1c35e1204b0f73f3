"""The one rule for names (kernel_hub.names): hostile names are refused before they touch a path."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel_hub import names
from kernel_hub.errors import KernelHubError, UnsafeNameError


@pytest.mark.parametrize("good", ["kernel-hub/ragged-dot-tpu", "acme/x", "A.b/c_d", "org1/name.v2"])
def test_repo_ids_accepted(good):
    assert names.check_repo_id(good) == good


@pytest.mark.parametrize("bad", ["", "x", "a/b/c", "../x", "a/..", "/etc/passwd", "a/-b", "a/b--c", "a/.git",
                                 "a/b.git", "a /b", "a/b\n", None, 3, "a\\b/c"])
def test_repo_ids_refused(bad):
    with pytest.raises(UnsafeNameError):
        names.check_repo_id(bad)


@pytest.mark.parametrize("good", ["jax-tpu", "torch-cpu", "torch28-cxx11-cu128-x86_64-linux", "jax-universal"])
def test_variant_names_accepted(good):
    assert names.check_variant_name(good) == good


@pytest.mark.parametrize("bad", ["/tmp/victim", "../../../tmp/victim", "jax/tpu", ".", "..", "", "-rf", "Jax-TPU",
                                 "jax-tpu/../x", "jax tpu", "a" * 200])
def test_variant_names_refused(bad):
    with pytest.raises(UnsafeNameError):
        names.check_variant_name(bad)


@pytest.mark.parametrize("bad", ["os.path", "1abc", "class", "a-b", "", "../x", "__init__.py"])
def test_python_names_refused(bad):
    with pytest.raises(UnsafeNameError):
        names.check_python_name(bad)


@pytest.mark.parametrize("bad", ["sub/x.py", "../x.py", "x.pyc", "x", "/abs.py", ".hidden.py"])
def test_entry_files_refused(bad):
    with pytest.raises(UnsafeNameError):
        names.check_entry_file(bad)


@pytest.mark.parametrize("good", ["v1", "v1.2.0", "main", "refs-like/v1", "release_1"])
def test_ref_names_accepted(good):
    assert names.check_ref_name(good) == good


@pytest.mark.parametrize("bad", ["--force", "-d", "a..b", "x.lock", "a/../b", "/v1", "v1/",
                                 "0123456789abcdef" * 2 + "01234567", "v1 v2", "v1\n", "@{u}", "a~1", "a^", "a:b", ""])
def test_ref_names_refused(bad):
    with pytest.raises(UnsafeNameError):
        names.check_ref_name(bad)


@pytest.mark.parametrize("bad", ["/etc/passwd", "../x", "a/../../b", "a//b", ".pyc", "a/./b", "a\\..\\b", "x\0y", ""])
def test_relative_paths_refused(bad):
    with pytest.raises(UnsafeNameError):
        names.check_relative_path(bad)


def test_unsafe_name_error_is_a_user_error():
    assert issubclass(UnsafeNameError, KernelHubError)


def test_safe_join_stays_inside_even_through_a_link(tmp_path: Path):
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "link").symlink_to(outside)
    assert names.safe_join(root, "a/b.py") == root / "a" / "b.py"
    with pytest.raises(UnsafeNameError):
        names.safe_join(root, "link/x")
    with pytest.raises(UnsafeNameError):
        names.safe_join(root, "../outside")


def test_safe_rmtree_refuses_outside_and_never_follows_links(tmp_path: Path):
    root = tmp_path / "root"
    (root / "inside").mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("sentinel")
    with pytest.raises(UnsafeNameError):
        names.safe_rmtree(root, victim)
    with pytest.raises(UnsafeNameError):
        names.safe_rmtree(root, root / ".." / "victim")
    (root / "link").symlink_to(victim)
    names.safe_rmtree(root, root / "link")
    assert (victim / "keep.txt").read_text() == "sentinel" and not (root / "link").exists()
    names.safe_rmtree(root, root / "inside")
    assert not (root / "inside").exists()
