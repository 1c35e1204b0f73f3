"""Repositories of the local Hub store: bare git repositories driven through the git CLI.

Tags, branches and commits are git's own, so a store can be inspected, backed up or pushed with
plain git. Layout: STORE/<type>s/<namespace>/<name>.git (type: model, kernel, dataset).
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO_TYPES = ("model", "kernel", "dataset")
_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?$")
_REF_NAME = re.compile(r"^[A-Za-z0-9._-]+(?:/[A-Za-z0-9._-]+)*$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_GITATTRIBUTES = b"# kernel-hub store: regular git blobs, no LFS\n"


class StoreError(Exception):
    """A request the store cannot satisfy; `code` maps to the Hub's X-Error-Code header."""

    def __init__(self, status: int, code: str | None, message: str):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def not_found(code: str, message: str) -> StoreError:
    return StoreError(404, code, message)


@dataclass(frozen=True)
class Entry:
    """One tree entry: a file (blob) or a directory (tree)."""

    path: str
    kind: str        # "file" | "directory"
    oid: str         # git object id: what the Hub reports and uses as a regular file's ETag
    size: int


@dataclass(frozen=True)
class CommitMeta:
    oid: str
    title: str
    date: str        # ISO 8601


def check_name(part: str, what: str) -> str:
    """Refuse names that could escape the store or confuse git (.., leading dots, slashes)."""
    if not _NAME.match(part) or ".." in part or part.endswith(".git"):
        raise StoreError(400, None, f"invalid {what} {part!r}")
    return part


def check_ref_name(name: str) -> str:
    """Branch and tag names git and the Hub both accept; never an option or a path escape."""
    if not _REF_NAME.match(name) or ".." in name or name.endswith(".lock") or name.startswith("refs/"):
        raise StoreError(400, None, f"invalid ref name {name!r}")
    return name


def check_path(path: str) -> str:
    """A path inside a repo: relative, POSIX, no empty, '.' or '..' parts, no .git."""
    parts = path.split("/")
    if not path or any(p in ("", ".", "..") for p in parts) or parts[0] == ".git" or "\0" in path:
        raise StoreError(400, None, f"invalid path in repo {path!r}")
    return path


class GitRepo:
    """One bare repository. Writes are serialised per repo; reads run concurrently."""

    def __init__(self, path: Path, repo_type: str, repo_id: str):
        self.path = path
        self.repo_type = repo_type
        self.repo_id = repo_id
        self.write_lock = threading.Lock()

    # -- plumbing -------------------------------------------------------------------------------
    def git(self, *args: str, input: bytes | None = None, env: dict[str, str] | None = None,
            check: bool = True) -> bytes:
        full_env = dict(_GIT_ENV)
        if env:
            full_env.update(env)
        proc = subprocess.run(
            ["git", "--git-dir", str(self.path), *args],
            input=input, capture_output=True, env=full_env, check=False,
        )
        if check and proc.returncode != 0:
            raise StoreError(500, None, f"git {args[0]} failed: {proc.stderr.decode(errors='replace').strip()}")
        return proc.stdout

    def _rev_parse(self, ref: str) -> str | None:
        proc = subprocess.run(
            ["git", "--git-dir", str(self.path), "rev-parse", "--verify", "-q", "--end-of-options",
             f"{ref}^{{commit}}"],
            capture_output=True, env=_GIT_ENV, check=False,
        )
        return proc.stdout.decode().strip() if proc.returncode == 0 else None

    # -- reads ----------------------------------------------------------------------------------
    def resolve(self, revision: str) -> str:
        """A branch, a tag or a full commit id -> the commit id (RevisionNotFound otherwise)."""
        if _COMMIT.match(revision):
            commit = self._rev_parse(revision)
            if commit == revision:
                return commit
        elif _REF_NAME.match(revision) and ".." not in revision:
            for prefix in ("refs/heads/", "refs/tags/"):
                commit = self._rev_parse(prefix + revision)
                if commit:
                    return commit
        raise not_found("RevisionNotFound", f"Invalid rev id: {revision}")

    def refs(self) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        """(branches, tags) as (name, commit); annotated tags are peeled to their commit."""
        out = self.git("for-each-ref", "--format=%(refname)%00%(objectname)%00%(*objectname)",
                       "refs/heads", "refs/tags").decode()
        branches, tags = [], []
        for line in out.splitlines():
            ref, obj, peeled = line.split("\0")
            if ref.startswith("refs/heads/"):
                branches.append((ref[len("refs/heads/"):], obj))
            else:
                tags.append((ref[len("refs/tags/"):], peeled or obj))
        return sorted(branches), sorted(tags)

    def commit_meta(self, rev: str, path: str | None = None) -> CommitMeta | None:
        # The Hub's date format, which huggingface_hub parses strictly: UTC with milliseconds and "Z".
        args = ["log", "-1", "--date=format-local:%Y-%m-%dT%H:%M:%S.000Z", "--format=%H%x00%s%x00%cd", rev]
        if path:
            args += ["--", path]
        out = self.git(*args).decode().strip()
        if not out:
            return None
        oid, title, date = out.split("\0")
        return CommitMeta(oid, title, date)

    def _ls_tree(self, *args: str) -> list[Entry]:
        out = self.git("ls-tree", "-l", "-z", *args)
        entries = []
        for record in out.split(b"\0"):
            if not record:
                continue
            meta, path = record.split(b"\t", 1)
            _mode, kind, oid, size = meta.decode().split()
            if kind == "commit":  # submodules never appear in a Hub repo
                continue
            entries.append(Entry(path.decode(), "file" if kind == "blob" else "directory", oid,
                                 int(size) if kind == "blob" else 0))
        return entries

    def list_tree(self, commit: str, path: str = "", recursive: bool = False) -> list[Entry]:
        """Entries under `path` (the root when empty); EntryNotFound when it is not a folder."""
        if path:
            check_path(path)
            found = self.paths_info(commit, [path])
            if not found or found[0].kind != "directory":
                raise not_found("EntryNotFound", f"{path} is not a folder at {commit}")
        args = ["-r", "-t"] if recursive else []
        return self._ls_tree(*args, commit, *(["--", f"{path}/"] if path else []))

    def paths_info(self, commit: str, paths: Sequence[str]) -> list[Entry]:
        """The entries for exactly these paths; paths that do not exist are left out."""
        wanted = [check_path(p.strip("/")) for p in paths if p.strip("/")]
        if not wanted:
            return []
        return [e for e in self._ls_tree(commit, "--", *wanted) if e.path in wanted]

    def all_files(self, commit: str) -> list[Entry]:
        return [e for e in self._ls_tree("-r", commit) if e.kind == "file"]

    def file_entry(self, commit: str, path: str) -> Entry:
        found = self.paths_info(commit, [path])
        if not found or found[0].kind != "file":
            raise not_found("EntryNotFound", f"{path} does not exist at {commit}")
        return found[0]

    def read_blob(self, oid: str) -> bytes:
        return self.git("cat-file", "blob", oid)

    # -- writes (callers hold write_lock) -------------------------------------------------------
    def commit_changes(self, branch: str, message: str, description: str,
                       files: Iterable[tuple[str, bytes]], deleted_files: Iterable[str],
                       deleted_folders: Iterable[str], parent: str | None) -> tuple[str, bool]:
        """Apply additions and deletions on top of `branch` as one commit -> (commit id, changed).

        Builds the tree in a private index (never a work tree), then moves the branch with a
        compare-and-swap update-ref, so a concurrent writer can never be silently overwritten.
        """
        head = self._rev_parse(f"refs/heads/{branch}")
        if head is None:
            raise not_found("RevisionNotFound", f"branch {branch} does not exist")
        if parent is not None and parent != head:
            raise StoreError(412, None, f"parent commit {parent} is not the head of {branch} ({head})")
        index = self.path / f"kh-index-{threading.get_ident()}"
        env = {"GIT_INDEX_FILE": str(index)}
        try:
            self.git("read-tree", head, env=env)
            for folder in deleted_folders:
                folder = check_path(folder.strip("/"))
                listed = self.git("ls-files", "-z", "--", f"{folder}/", env=env).split(b"\0")
                for name in filter(None, listed):
                    self.git("update-index", "--force-remove", "--", name.decode(), env=env)
            for name in deleted_files:
                name = check_path(name)
                if not self.git("ls-files", "--", name, env=env).strip():
                    raise not_found("EntryNotFound", f"A file with this name doesn't exist: {name}")
                self.git("update-index", "--force-remove", "--", name, env=env)
            for name, content in files:
                name = check_path(name)
                oid = self.git("hash-object", "-w", "--stdin", input=content).decode().strip()
                self.git("update-index", "--add", "--cacheinfo", f"100644,{oid},{name}", env=env)
            tree = self.git("write-tree", env=env).decode().strip()
        finally:
            index.unlink(missing_ok=True)
        if tree == self.git("rev-parse", f"{head}^{{tree}}").decode().strip():
            return head, False
        text = message if not description else f"{message}\n\n{description}"
        commit = self.git("commit-tree", tree, "-p", head, "-F", "-", input=text.encode()).decode().strip()
        self.git("update-ref", f"refs/heads/{branch}", commit, head)
        return commit, True

    def create_ref(self, kind: str, name: str, commit: str, message: str | None = None) -> None:
        check_ref_name(name)
        ref = f"refs/{'heads' if kind == 'branch' else 'tags'}/{name}"
        if self._rev_parse(ref) is not None:
            raise StoreError(409, None, f"{kind} {name} already exists")
        other = f"refs/{'tags' if kind == 'branch' else 'heads'}/{name}"
        if self._rev_parse(other) is not None:
            raise StoreError(409, None, f"a {'tag' if kind == 'branch' else 'branch'} named {name} exists")
        if kind == "tag" and message:
            self.git("tag", "-a", name, commit, "-m", message)
        else:
            # The all-zero old value makes update-ref fail if the ref appeared meanwhile.
            self.git("update-ref", ref, commit, "0" * 40)

    def delete_ref(self, kind: str, name: str) -> None:
        check_ref_name(name)
        ref = f"refs/{'heads' if kind == 'branch' else 'tags'}/{name}"
        if self._rev_parse(ref) is None:
            raise not_found("RevisionNotFound", f"{kind} {name} does not exist")
        if kind == "branch" and name == "main":
            raise StoreError(403, None, "the main branch cannot be deleted")
        self.git("update-ref", "-d", ref)


_GIT_ENV = {
    **{k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TMPDIR", "SYSTEMROOT")},
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_AUTHOR_NAME": "kernel-hub",
    "GIT_AUTHOR_EMAIL": "kernel-hub@localhost",
    "GIT_COMMITTER_NAME": "kernel-hub",
    "GIT_COMMITTER_EMAIL": "kernel-hub@localhost",
    "HOME": os.devnull,
    "TZ": "UTC",
}


class GitStore:
    """All repositories under one folder."""

    def __init__(self, root: Path):
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self._repos: dict[tuple[str, str], GitRepo] = {}
        self._lock = threading.Lock()

    def _path(self, repo_type: str, repo_id: str) -> Path:
        if repo_type not in REPO_TYPES:
            raise StoreError(400, None, f"unknown repo type {repo_type!r}")
        namespace, _, name = repo_id.partition("/")
        check_name(namespace, "namespace")
        check_name(name, "repo name")
        return self.root / f"{repo_type}s" / namespace / f"{name}.git"

    def get(self, repo_type: str, repo_id: str) -> GitRepo:
        path = self._path(repo_type, repo_id)
        with self._lock:
            repo = self._repos.get((repo_type, repo_id))
            if repo is None:
                if not (path / "HEAD").is_file():
                    raise not_found("RepoNotFound", f"Repository {repo_id} ({repo_type}) not found")
                repo = self._repos[(repo_type, repo_id)] = GitRepo(path, repo_type, repo_id)
            return repo

    def create(self, repo_type: str, repo_id: str) -> GitRepo:
        """A new bare repo with one initial commit on main, as the Hub creates them."""
        path = self._path(repo_type, repo_id)
        with self._lock:
            if (path / "HEAD").is_file():
                raise StoreError(409, None, f"You already created this {repo_type} repo: {repo_id}")
            tmp = path.with_name(f".{path.name}.creating-{os.getpid()}-{threading.get_ident()}")
            tmp.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(tmp)], env=_GIT_ENV,
                           check=True, capture_output=True)
            repo = GitRepo(tmp, repo_type, repo_id)
            blob = repo.git("hash-object", "-w", "--stdin", input=_GITATTRIBUTES).decode().strip()
            tree = repo.git("mktree", input=f"100644 blob {blob}\t.gitattributes\n".encode()).decode().strip()
            commit = repo.git("commit-tree", tree, "-m", "initial commit").decode().strip()
            repo.git("update-ref", "refs/heads/main", commit)
            tmp.rename(path)  # appears complete or not at all
            repo = self._repos[(repo_type, repo_id)] = GitRepo(path, repo_type, repo_id)
            return repo

    def delete(self, repo_type: str, repo_id: str) -> None:
        import shutil

        repo = self.get(repo_type, repo_id)
        with self._lock:
            self._repos.pop((repo_type, repo_id), None)
            trash = repo.path.with_name(f".{repo.path.name}.deleting")
            repo.path.rename(trash)
            shutil.rmtree(trash, ignore_errors=True)

    def namespaces(self) -> set[str]:
        found = set()
        for repo_type in REPO_TYPES:
            base = self.root / f"{repo_type}s"
            if base.is_dir():
                found.update(p.name for p in base.iterdir() if p.is_dir() and any(p.glob("*.git")))
        return found
