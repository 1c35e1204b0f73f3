"""`kernel-hub serve` against the real huggingface_hub client and HF `kernels`, in a real server process."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
hf = pytest.importorskip("huggingface_hub")

from huggingface_hub import HfApi  # noqa: E402
from huggingface_hub.errors import (  # noqa: E402
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from tests.hub_server import (  # noqa: E402
    cli_command,
    free_port,
    hf_kernels_toy,
    hub_env,
    running_server,
)

TOKEN = "test-token"
SERVER_ARGS = ("--trusted-org", "acme")


@pytest.fixture
def api(server) -> HfApi:
    return HfApi(endpoint=server.url, token=TOKEN)


def _git(store: Path, repo: str, *args: str) -> str:
    git_dir = store / "kernels" / f"{repo}.git"
    return subprocess.run(["git", "--git-dir", str(git_dir), *args], capture_output=True, text=True,
                          check=True).stdout


def test_upload_refs_tree_and_download_roundtrip(server, api: HfApi, tmp_path: Path) -> None:
    repo = "acme/relu"
    url = api.create_repo(repo, repo_type="kernel")
    assert url.endswith("/kernels/acme/relu")
    folder = hf_kernels_toy(tmp_path / "src")
    commit = api.upload_folder(repo_id=repo, repo_type="kernel", folder_path=folder, commit_message="v1").oid
    api.create_tag(repo, tag="v1.0.0", repo_type="kernel", revision=commit)
    api.create_branch(repo, branch="v1", repo_type="kernel", revision=commit)

    refs = api.list_repo_refs(repo, repo_type="kernel")
    assert {(b.name, b.target_commit) for b in refs.branches} >= {("v1", commit), ("main", commit)}
    assert [(t.name, t.target_commit) for t in refs.tags] == [("v1.0.0", commit)]

    # Tags, branches and commits are git's own.
    assert _git(server.store, repo, "rev-parse", "refs/tags/v1.0.0^{commit}").strip() == commit
    assert _git(server.store, repo, "log", "--format=%s", "-1", "v1").strip() == "v1"

    tree = list(api.list_repo_tree(repo, repo_type="kernel", revision="v1", recursive=True))
    files = {e.path: e for e in tree if isinstance(e, hf.hf_api.RepoFile)}
    folders = {e.path for e in tree if isinstance(e, hf.hf_api.RepoFolder)}
    assert {"build", "build/torch-cpu", "build/torch-cpu/relu"} <= folders
    assert "build/torch-cpu/relu/_ops.py" in files
    ops = (folder / "build/torch-cpu/relu/_ops.py").read_bytes()
    assert files["build/torch-cpu/relu/_ops.py"].size == len(ops)

    top = list(api.list_repo_tree(repo, path_in_repo="build", repo_type="kernel", revision=commit))
    assert [(e.path, type(e).__name__) for e in top] == [("build/torch-cpu", "RepoFolder")]

    info = api.get_paths_info(repo, ["build/torch-cpu/metadata.json", "nope"], repo_type="kernel", revision="v1")
    assert [i.path for i in info] == ["build/torch-cpu/metadata.json"]

    assert api.repo_info(repo, repo_type="kernel", revision="v1.0.0").sha == commit

    cache = tmp_path / "cache"
    path = api.hf_hub_download(repo, "build/torch-cpu/relu/_ops.py", repo_type="kernel", revision="v1",
                               cache_dir=cache)
    assert Path(path).read_bytes() == ops
    assert f"snapshots/{commit}/" in Path(path).as_posix()
    assert (cache / "kernels--acme--relu" / "refs" / "v1").read_text() == commit


def test_resolve_headers_and_ranges(server, api: HfApi, tmp_path: Path) -> None:
    repo = "acme/headers"
    api.create_repo(repo, repo_type="kernel")
    api.upload_file(path_or_fileobj=b"0123456789", path_in_repo="data.bin", repo_id=repo, repo_type="kernel")
    commit = api.repo_info(repo, repo_type="kernel").sha
    blob = _git(server.store, repo, "rev-parse", f"{commit}:data.bin").strip()

    head = urllib.request.Request(f"{server.url}/kernels/{repo}/resolve/main/data.bin", method="HEAD")
    with urllib.request.urlopen(head) as resp:
        assert resp.headers["ETag"] == f'"{blob}"'
        assert resp.headers["X-Repo-Commit"] == commit
        assert resp.headers["Content-Length"] == "10"
    ranged = urllib.request.Request(f"{server.url}/kernels/{repo}/resolve/{commit}/data.bin",
                                    headers={"Range": "bytes=3-5"})
    with urllib.request.urlopen(ranged) as resp:
        assert resp.status == 206
        assert resp.read() == b"345"
        assert resp.headers["Content-Range"] == "bytes 3-5/10"


def test_hub_errors_map_to_huggingface_hub_exceptions(server, api: HfApi, tmp_path: Path) -> None:
    with pytest.raises(RepositoryNotFoundError):
        api.list_repo_refs("acme/does-not-exist", repo_type="kernel")
    api.create_repo("acme/errors", repo_type="kernel")
    with pytest.raises(RevisionNotFoundError):
        api.list_repo_tree("acme/errors", repo_type="kernel", revision="v9").__next__()
    with pytest.raises(RemoteEntryNotFoundError):
        api.hf_hub_download("acme/errors", "missing.txt", repo_type="kernel", cache_dir=tmp_path)
    with pytest.raises(HfHubHTTPError) as exc:
        api.create_repo("acme/errors", repo_type="kernel")
    assert exc.value.response.status_code == 409
    api.create_repo("acme/errors", repo_type="kernel", exist_ok=True)  # the 409 HF clients rely on


def test_writes_need_the_token(server, tmp_path: Path) -> None:
    anonymous = HfApi(endpoint=server.url, token=False)
    wrong = HfApi(endpoint=server.url, token="wrong")
    for client in (anonymous, wrong):
        with pytest.raises(HfHubHTTPError) as exc:
            client.create_repo("acme/nope", repo_type="kernel")
        assert exc.value.response.status_code == 401
    HfApi(endpoint=server.url, token=TOKEN).create_repo("acme/guarded", repo_type="kernel")
    with pytest.raises(HfHubHTTPError) as exc:
        wrong.upload_file(path_or_fileobj=b"x", path_in_repo="x", repo_id="acme/guarded", repo_type="kernel")
    assert exc.value.response.status_code == 401
    with pytest.raises(HfHubHTTPError):
        wrong.create_tag("acme/guarded", tag="v0.0.1", repo_type="kernel")
    # Reads stay open.
    assert anonymous.list_repo_refs("acme/guarded", repo_type="kernel").branches


def test_branches_move_tags_do_not(server, api: HfApi) -> None:
    repo = "acme/moves"
    api.create_repo(repo, repo_type="kernel")
    first = api.upload_file(path_or_fileobj=b"1", path_in_repo="f", repo_id=repo, repo_type="kernel").oid
    api.create_branch(repo, branch="v1", revision=first, repo_type="kernel")
    api.create_tag(repo, tag="v1.0.0", revision=first, repo_type="kernel")
    second = api.upload_file(path_or_fileobj=b"2", path_in_repo="f", repo_id=repo, repo_type="kernel").oid
    assert second != first
    with pytest.raises(HfHubHTTPError) as exc:
        api.create_tag(repo, tag="v1.0.0", revision=second, repo_type="kernel")
    assert exc.value.response.status_code == 409
    api.delete_branch(repo, branch="v1", repo_type="kernel")
    api.create_branch(repo, branch="v1", revision=second, repo_type="kernel")
    refs = api.list_repo_refs(repo, repo_type="kernel")
    assert {b.name: b.target_commit for b in refs.branches}["v1"] == second
    assert {t.name: t.target_commit for t in refs.tags}["v1.0.0"] == first


def test_same_content_makes_no_new_commit(server, api: HfApi, tmp_path: Path) -> None:
    repo = "acme/noop"
    api.create_repo(repo, repo_type="kernel")
    folder = hf_kernels_toy(tmp_path / "src")
    one = api.upload_folder(repo_id=repo, repo_type="kernel", folder_path=folder).oid
    two = api.upload_folder(repo_id=repo, repo_type="kernel", folder_path=folder).oid
    assert one == two
    assert _git(server.store, repo, "rev-list", "--count", "main").strip() == "2"  # initial + upload


def test_model_repos_work_too(server, api: HfApi, tmp_path: Path) -> None:
    api.create_repo("acme/model", repo_type="model")
    api.upload_file(path_or_fileobj=b'{"a": 1}', path_in_repo="config.json", repo_id="acme/model")
    path = api.hf_hub_download("acme/model", "config.json", cache_dir=tmp_path)
    assert json.loads(Path(path).read_text()) == {"a": 1}
    assert (server.store / "models" / "acme" / "model.git").is_dir()


def test_hf_kernels_get_kernel_loads_from_the_store(server, api: HfApi, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("kernels")
    repo = "acme/relu-hf"
    api.create_repo(repo, repo_type="kernel")
    commit = api.upload_folder(repo_id=repo, repo_type="kernel", folder_path=hf_kernels_toy(tmp_path / "s")).oid
    api.create_branch(repo, branch="v1", revision=commit, repo_type="kernel")
    server.reset()
    script = (
        "import kernels, torch\n"
        f"m = kernels.get_kernel({repo!r}, version=1)\n"
        "print(m.relu(torch.tensor([-1.0, 2.0])).tolist())\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], env=hub_env(server, tmp_path / "cache"),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[0.0, 2.0]"
    paths = [p for _, p, _ in server.requests()]
    assert "/api/organizations/acme/overview" in paths  # what kernels asks before loading
    assert all(status == 200 for _, _, status in server.requests()), server.requests()


def test_read_token_required(tmp_path: Path) -> None:
    with running_server(tmp_path / "store", token=TOKEN, read_token_required=True) as srv:
        HfApi(endpoint=srv.url, token=TOKEN).create_repo("acme/private", repo_type="kernel")
        with pytest.raises(HfHubHTTPError) as exc:
            HfApi(endpoint=srv.url, token=False).list_repo_refs("acme/private", repo_type="kernel")
        assert exc.value.response.status_code == 401
        assert HfApi(endpoint=srv.url, token=TOKEN).list_repo_refs("acme/private", repo_type="kernel").branches


def test_server_without_token_is_read_only(tmp_path: Path) -> None:
    with running_server(tmp_path / "store", token=None, test_hooks=False) as srv:
        with pytest.raises(HfHubHTTPError) as exc:
            HfApi(endpoint=srv.url, token="anything").create_repo("acme/x", repo_type="kernel")
        assert exc.value.response.status_code == 403
        with pytest.raises(urllib.error.HTTPError):  # test hooks are off unless asked for
            urllib.request.urlopen(urllib.request.Request(f"{srv.url}/_kernel_hub/faults", data=b"{}"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--host", "0.0.0.0"], "refusing to serve on non-loopback host"),
        (["--port", "70000"], "--port must be in 0..65535"),
        (["--read-token-required"], "--read-token-required needs --token"),
    ],
)
def test_serve_cli_refuses_bad_input_in_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    proc = subprocess.run([*cli_command(), "serve", "--store", str(tmp_path / "s"), *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(("args", "message"), [(["--max-commit-size", "lots"], "not a size"),
                                               (["--header-timeout", "0"], "not a number of seconds")])
def test_serve_cli_refuses_bad_limits(tmp_path: Path, args: list[str], message: str) -> None:
    proc = subprocess.run([*cli_command(), "serve", "--store", str(tmp_path / "s"), *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and message in proc.stderr


def test_serve_cli_port_in_use_is_one_line(tmp_path: Path) -> None:
    import socket

    port = free_port()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port))
        busy.listen()
        proc = subprocess.run([*cli_command(), "serve", "--store", str(tmp_path / "s"), "--port", str(port)],
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "in use" in lines[0], proc.stderr


def test_serve_cli_port_zero_picks_a_free_port_and_prints_its_url(tmp_path: Path) -> None:
    proc = subprocess.Popen([*cli_command(), "serve", "--store", str(tmp_path / "s"), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        url = re.search(r" at (http://127\.0\.0\.1:(\d+)) ", line)
        assert url and int(url.group(2)) > 0, line
        with urllib.request.urlopen(f"{url.group(1)}/api/agent-harnesses", timeout=20) as resp:
            assert json.load(resp) == {"standardEnvVars": [], "harnesses": {}}
    finally:
        proc.terminate()
        proc.wait(timeout=20)
