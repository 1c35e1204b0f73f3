"""The smaller misfires a newcomer met: a typo'd tag or case name, the progress line's `[variant]`, a 401 with no
token sent, offline `info` where offline `download` works, re-publishing identical content, and torch tensors
handed to a jax build."""

from __future__ import annotations

import io
import shutil
import subprocess
from pathlib import Path

import pytest

import kernel_hub as kh
from kernel_hub import cli
from kernel_hub.errors import KernelHubError
from kernel_hub.sources.hub.client import auth_hint
from tests.hub_server import cli_command, hub_env, running_server
from tests.toy_folder import TOY, copy_toy

TOKEN = "newcomer-token"


def run(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([*cli_command(), *args], env=env, capture_output=True, text=True, timeout=300)


# -- a typo'd --tag / names= --------------------------------------------------------------------------------------


def test_a_typod_tag_lists_the_valid_tags(capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["validate", "--path", str(TOY), "--backend", "cpu", "--tag", "edeg"]) == 1
    err = capsys.readouterr().err
    assert "no case has tag 'edeg'" in err and "edge" in err and "0/0" not in err
    assert len(err.strip().splitlines()) == 1


def test_a_typod_case_name_lists_the_cases() -> None:
    module = kh.get_local_kernel(TOY, backend="cpu")
    names = [c.name for c in kh.validate(module, backend="cpu").cases]
    with pytest.raises(KernelHubError, match="no case is named 'nope'") as exc:
        kh.validate(module, backend="cpu", names=("nope", names[0]))
    assert all(n in str(exc.value) for n in names)
    assert [c.name for c in kh.validate(module, backend="cpu", names=(names[0],)).cases] == [names[0]]


# -- the terminal progress line ------------------------------------------------------------------------------------


def test_the_progress_line_keeps_square_brackets() -> None:
    pytest.importorskip("rich")
    from kernel_hub.ui.progress import RichProgress

    live = RichProgress(io.StringIO())
    try:
        live.phase("fetching [torch-cpu] and checking every sha256", 3)
        text = live.bar.columns[1].render(live.bar.tasks[0])
        assert text.plain == "fetching [torch-cpu] and checking every sha256"
    finally:
        live.close()


# -- a server: 401 without a token, offline info, identical re-publish -----------------------------------------------


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory):
    """A `kernel-hub serve` holding the toy kernel as acme/toy-scale (published through the CLI)."""
    root = tmp_path_factory.mktemp("newcomer")
    toy = root / "toy"
    copy_toy(toy)
    with running_server(root / "store", token=TOKEN) as server:
        env = hub_env(server, root / "publish-cache", HF_TOKEN=TOKEN)
        out = run("publish", str(toy), "--repo", "acme/toy-scale", "--skip-tpu-compile", "--skip-validation",
                  "--endpoint", server.url,
                  env=env)
        assert out.returncode == 0, out.stderr
        yield server, toy, root


def test_no_token_sent_is_said_naming_hf_token(tmp_path: Path, published) -> None:
    server, _, _ = published
    store = tmp_path / "store"  # a copy: one read-write server per store
    shutil.copytree(server.store, store)
    with running_server(store, token=TOKEN, read_token_required=True) as locked:
        env = hub_env(locked, tmp_path / "cache")
        out = run("info", "acme/toy-scale", env=env)
        assert out.returncode == 1 and "HTTP 401" in out.stderr
        assert "no token was sent" in out.stderr and "HF_TOKEN" in out.stderr
        wrong = run("info", "acme/toy-scale", env={**env, "HF_TOKEN": "not-the-token"})
        assert wrong.returncode == 1 and "the token sent was refused" in wrong.stderr
        assert "no token was sent" not in wrong.stderr
        assert run("info", "acme/toy-scale", env={**env, "HF_TOKEN": TOKEN}).returncode == 0


def test_auth_hint_decision() -> None:
    assert "no token was sent" in auth_hint(401, False) and "HF_TOKEN" in auth_hint(401, False)
    assert "refused" in auth_hint(401, True) and "refused" in auth_hint(403, True)
    assert auth_hint(404, False) == "" and auth_hint(500, True) == ""


def test_offline_info_works_where_offline_download_does(tmp_path: Path, published) -> None:
    server, _, _ = published
    env = hub_env(server, tmp_path / "cache", KERNEL_HUB_BACKEND="cpu")
    offline = {**env, "HF_HUB_OFFLINE": "1"}
    never = run("info", "acme/toy-scale", env=offline)  # nothing cached yet: one line saying so
    assert never.returncode == 1 and "HF_HUB_OFFLINE=1" in never.stderr
    assert len(never.stderr.strip().splitlines()) == 1
    assert run("download", "acme/toy-scale", "--version", "1", "--backend", "cpu", env=env).returncode == 0
    assert run("download", "acme/toy-scale", "--version", "1", "--backend", "cpu", env=offline).returncode == 0
    info = run("info", "acme/toy-scale", env=offline)
    assert info.returncode == 0, info.stderr
    assert "jax-cpu" in info.stdout and "only the builds in the cache" in info.stdout
    assert "torch-cpu" not in info.stdout  # never downloaded: not claimed


def test_republishing_identical_content_validates_nothing(published, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernel_hub.publish import release as pub

    server, toy, _ = published
    ran: list[str] = []
    monkeypatch.setattr(pub, "validate_local", lambda folder, log: ran.append("validate") or [])
    monkeypatch.setattr(pub, "run_gate", lambda *a, **k: ran.append("gate") or {})
    result = pub.publish(toy, repo_id="acme/toy-scale", endpoint=server.url, token=TOKEN, skip_tpu_compile=True,
                         log=lambda _line: None)
    assert result.unchanged and "nothing to do" in result.summary() and ran == []
    assert result.validated is False


def test_changed_content_under_a_published_version_is_refused_before_validation(
        published, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernel_hub.publish import release as pub

    server, toy, _ = published
    changed = tmp_path / "toy"
    shutil.copytree(toy, changed)
    reference = next(p for p in changed.rglob("*.py") if p.name != "__init__.py")
    reference.write_text(reference.read_text() + "\n# changed\n")
    ran: list[str] = []
    monkeypatch.setattr(pub, "validate_local", lambda folder, log: ran.append("validate") or [])
    with pytest.raises(KernelHubError, match="already published with different content"):
        pub.publish(changed, repo_id="acme/toy-scale", endpoint=server.url, token=TOKEN, skip_tpu_compile=True,
                    log=lambda _line: None)
    assert ran == []  # a version is immutable: refused in seconds, nothing validated or uploaded


# -- torch tensors handed to a jax build ---------------------------------------------------------------------------


def test_torch_tensors_to_a_jax_build_name_the_torch_build() -> None:
    torch = pytest.importorskip("torch")
    import numpy as np

    from kernel_hub.load.framework_guard import FrameworkMismatchError

    jax_build = kh.get_local_kernel(TOY, backend="cpu")  # framework defaults to "jax"
    assert jax_build.__kernel_hub__.framework == "jax"
    x = np.arange(6, dtype=np.float32)
    np.testing.assert_allclose(np.asarray(jax_build.scale(x, 3.0)), x.astype(np.float64) * 3.0)
    for call in (lambda: jax_build.scale(torch.ones(3)), lambda: jax_build.scale(x=torch.ones(3)),
                 lambda: jax_build.scale([torch.ones(3)])):
        with pytest.raises(FrameworkMismatchError) as exc:
            call()
        message = str(exc.value)
        assert "framework='torch'" in message and "test-org/toy-scale" in message and "scale" in message
    torch_build = kh.get_local_kernel(TOY, backend="cpu", framework="torch")
    assert torch.equal(torch_build.scale(torch.ones(3), 2.0), torch.full((3,), 2.0))
