"""Property-based fuzzing of the server's JSON endpoints (hypothesis, in process through starlette's
TestClient): random and malformed bodies, names and path segments never get a 500, every refusal is a
Hub-style error with a one-line X-Error-Message, and no ref that could be read as an option or a commit
id ever reaches the store."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import pytest

pytest.importorskip("starlette")
pytest.importorskip("dulwich")
hypothesis = pytest.importorskip("hypothesis")

from dulwich.repo import Repo  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from kernel_hub.names import check_ref_name  # noqa: E402
from kernel_hub.server import build_app  # noqa: E402

TOKEN = "fuzz-token"
REPO = "acme/fuzz"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
FUZZ = settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

# Values a client might send where a string is expected: random text, tricky names, any JSON.
TRICKY = ["--force", "-d", "main", "v1", "refs/heads/main", "refs/tags/v1.0.0", "refs/pr/1", "../x", "a/../b",
          ".git", ".git/config", ".gitattributes", "f.txt", "dir", "dir/", "dir/a.txt", "a" * 40, "0" * 40, "..",
          "", " ", "\n", "\0", "a\nb", "x.lock", "HEAD", "/", "//", "é", "%2F", "a" * 300]
names = st.one_of(st.sampled_from(TRICKY), st.text(max_size=30))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | names,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
name_or_any = st.one_of(names, names, json_values)
base64ish = st.one_of(st.sampled_from(["", "QUJD", "QUJD=", "QQ==", "!!", "QU JD", "Zm9v\n"]), st.text(max_size=12))


def _object(**fields) -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries({}, optional=fields)


def _body(structured: st.SearchStrategy) -> st.SearchStrategy[bytes]:
    """Mostly well-formed JSON of the endpoint's shape with random values; sometimes any JSON or bytes."""
    return st.one_of(
        structured.map(lambda v: json.dumps(v).encode()),
        json_values.map(lambda v: json.dumps(v).encode()),
        st.binary(max_size=64),
    )


commit_line = st.one_of(
    st.fixed_dictionaries({"key": st.sampled_from(["header", "file", "deletedFile", "deletedFolder", "lfsFile", "x"]),
                           "value": _object(summary=name_or_any, description=name_or_any, parentCommit=name_or_any,
                                            path=name_or_any, content=st.one_of(base64ish, json_values),
                                            encoding=st.sampled_from(["base64", "utf-8", ""]))}).map(json.dumps),
    json_values.map(json.dumps),
    st.text(max_size=20),
)
commit_body = st.lists(commit_line, max_size=5).map(lambda lines: "\n".join(lines).encode("utf-8", "replace"))


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory):
    store = tmp_path_factory.mktemp("fuzz") / "store"
    with TestClient(build_app(store, token=TOKEN)) as c:
        assert c.post("/api/repos/create", json={"name": "fuzz", "organization": "acme", "type": "kernel"},
                      headers=AUTH).status_code == 200
        header = json.dumps({"key": "header", "value": {"summary": "seed"}})
        files = [json.dumps({"key": "file", "value": {"path": p, "content": "QUJD"}}) for p in ("f.txt", "dir/a.txt")]
        seed = c.post(f"/api/kernels/{REPO}/commit/main", content="\n".join([header, *files]), headers=AUTH)
        assert seed.status_code == 200, seed.text
        c.store = store  # type: ignore[attr-defined]
        yield c


def _check(response) -> None:
    """Never a 500; a refusal is the Hub's error shape with one clean header line."""
    assert response.status_code < 500, (response.status_code, response.text[:300])
    if response.status_code >= 400:
        message = response.headers.get("x-error-message")
        assert message and not any(c in message for c in "\r\n\0")
        assert isinstance(response.json()["error"], str)


def _refs_are_safe(store: Path) -> None:
    git = Repo(str(store / "kernels" / f"{REPO}.git"))
    try:
        for ref in git.refs.allkeys():
            if ref != b"HEAD":
                check_ref_name(ref.decode().split("/", 2)[2])  # never an option, never 40 hex
    finally:
        git.close()


@FUZZ
@given(body=_body(_object(name=name_or_any, organization=name_or_any,
                          type=st.one_of(st.sampled_from(["model", "kernel", "dataset", "space"]), json_values))),
       method=st.sampled_from(["POST", "DELETE"]))
def test_repo_create_and_delete(client, body: bytes, method: str) -> None:
    route = "/api/repos/create" if method == "POST" else "/api/repos/delete"
    if method == "DELETE" and b'"fuzz"' in body:
        return  # keep the repo the other tests use
    _check(client.request(method, route, content=body, headers=AUTH))


@FUZZ
@given(body=_body(_object(files=st.one_of(st.lists(_object(path=name_or_any, size=json_values), max_size=4),
                                          json_values))),
       revision=names)
def test_preupload(client, body: bytes, revision: str) -> None:
    _check(client.post(f"/api/kernels/{REPO}/preupload/{quote(revision, safe='')}", content=body, headers=AUTH))


@FUZZ
@given(body=_body(_object(paths=st.one_of(st.lists(name_or_any, max_size=4), name_or_any), expand=json_values)),
       revision=names, form=st.booleans())
def test_paths_info(client, body: bytes, revision: str, form: bool) -> None:
    headers = {"Content-Type": "application/x-www-form-urlencoded"} if form else {}
    _check(client.post(f"/api/kernels/{REPO}/paths-info/{quote(revision, safe='')}", content=body, headers=headers))


@FUZZ
@given(body=commit_body, revision=st.one_of(st.just("main"), names), query=st.sampled_from(["", "?create_pr=1"]))
def test_commit_ndjson(client, body: bytes, revision: str, query: str) -> None:
    response = client.post(f"/api/kernels/{REPO}/commit/{quote(revision, safe='')}{query}", content=body,
                           headers=AUTH)
    _check(response)


@FUZZ
@given(name=names, revision=names, body=_body(_object(startingPoint=name_or_any, tag=name_or_any,
                                                       message=name_or_any)),
       kind=st.sampled_from(["branch", "tag"]), method=st.sampled_from(["POST", "POST", "DELETE"]))
def test_branch_and_tag_create_and_delete(client, name: str, revision: str, body: bytes, kind: str,
                                          method: str) -> None:
    segment = name if kind == "branch" else revision
    if method == "DELETE" and segment in ("main", "refs/heads/main"):
        return  # deleting main is refused anyway (403); keep the repo usable
    _check(client.request(method, f"/api/kernels/{REPO}/{kind}/{quote(segment, safe='')}", content=body,
                          headers=AUTH))
    _refs_are_safe(client.store)


@FUZZ
@given(revision=names, path=st.lists(names, max_size=3),
       query=st.sampled_from(["", "?recursive=1", "?expand=1", "?recursive=true&expand=true", "?p=x"]))
def test_tree_listing_and_reads(client, revision: str, path: list[str], query: str) -> None:
    rev, rest = quote(revision, safe=""), "/".join(quote(p, safe="") for p in path)
    for url in (f"/api/kernels/{REPO}/tree/{rev}/{rest}{query}", f"/api/kernels/{REPO}/revision/{rev}{query}",
                f"/api/kernels/{REPO}/commits/{rev}{query}", f"/kernels/{REPO}/resolve/{rev}/{rest}"):
        _check(client.get(url))


@FUZZ
@given(segments=st.lists(names, max_size=7), method=st.sampled_from(["GET", "HEAD", "POST", "DELETE", "PUT"]),
       body=st.binary(max_size=32))
def test_any_path_and_method(client, segments: list[str], method: str, body: bytes) -> None:
    url = "/" + "/".join(quote(s, safe="") for s in segments if s)  # no "//": the client would read a host
    response = client.request(method, url, content=body if method in ("POST", "PUT") else None, headers=AUTH)
    assert response.status_code < 500, (method, url, response.status_code, response.text[:300])
