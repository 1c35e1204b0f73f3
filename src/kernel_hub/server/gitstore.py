"""Repositories of the local Hub store: bare git repositories read and written with dulwich.

Tags, branches and commits are git's own, so a store can be inspected, backed up or pushed with plain
git. Layout: STORE/<type>s/<namespace>/<name>.git (type: model, kernel, dataset). No git process is ever
started: no command line to inject options into, commits are built from trees without a work tree,
and every ref update is a compare-and-swap, so a concurrent writer is refused, never overwritten.
"""

from __future__ import annotations

import os
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from dulwich.diff_tree import tree_changes
from dulwich.errors import NotTreeError
from dulwich.file import FileLocked
from dulwich.index import commit_tree
from dulwich.objects import Blob, Commit, Tag, Tree
from dulwich.repo import Repo
from dulwich.walk import Walker

from ..errors import KernelHubError
from ..files import open_private
from ..names import safe_rmtree
from . import checks
from .blobfiles import TMP_OBJECT_PREFIX, BlobFiles, LooseWriter, temp_owner, write_loose
from .errors import HubError, StoreError, not_found

REPO_TYPES = checks.REPO_TYPES
IDENTITY = b"kernel-hub <kernel-hub@localhost>"
_GITATTRIBUTES = b"# kernel-hub store: regular git blobs, no LFS\n"
_FILE_MODE = 0o100644
STORE_LOCK = ".kernel-hub-serve.lock"  # held by the serving process: see GitStore.recover
LAST_COMMITS_BUDGET = 200_000  # commits + changed entries one `expand` may walk: well under a second here

__all__ = ["REPO_TYPES", "CommitMeta", "Entry", "GitRepo", "GitStore", "StoreError"]


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
    message: str     # the description: the commit message after its first line
    date: str        # ISO 8601 in UTC with milliseconds, as the Hub writes it (huggingface_hub parses it strictly)
    author: str


def _meta(commit: Commit) -> CommitMeta:
    text = commit.message.decode("utf-8", "replace")
    title, _, rest = text.partition("\n")
    date = datetime.fromtimestamp(commit.commit_time, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    author = commit.author.decode("utf-8", "replace").split(" <")[0]
    return CommitMeta(commit.id.decode(), title, rest.strip("\n"), date, author)


def _entry(path: str, mode: int, sha: bytes, size_of) -> Entry | None:
    if stat.S_ISDIR(mode):
        return Entry(path, "directory", sha.decode(), 0)
    if stat.S_ISREG(mode) or stat.S_ISLNK(mode):
        return Entry(path, "file", sha.decode(), size_of(sha.decode()))
    return None  # a submodule: never part of a Hub repo


def _with_folders(path: str) -> list[str]:
    """`a/b/c` -> [`a/b/c`, `a/b`, `a`]: a change to a file changes every folder above it."""
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(len(parts), 0, -1)]


def _no_size(_oid: str) -> int:
    return 0


class GitRepo:
    """One bare repository. Writes are serialised per repo (and compare-and-swap on refs); reads run
    concurrently, each on its own dulwich handle."""

    def __init__(self, path: Path, repo_type: str, repo_id: str):
        self.path = path
        self.repo_type = repo_type
        self.repo_id = repo_id
        self.write_lock = threading.Lock()
        self.blobs = BlobFiles(path, self._load_packed)

    @contextmanager
    def _open(self) -> Iterator[Repo]:
        repo = Repo(str(self.path), bare=True)
        try:
            yield repo
        finally:
            repo.close()

    def _load_packed(self, oid: str) -> bytes:
        with self._open() as repo:
            obj = repo.object_store[oid.encode()]
            if not isinstance(obj, Blob):
                raise HubError(500, f"object {oid} is not a blob")
            return obj.as_raw_string()

    # -- reads ----------------------------------------------------------------------------------
    def resolve(self, revision: str) -> str:
        """A branch, a tag (short or full name) or a full commit id -> the commit id (404 otherwise)."""
        rev = checks.revision(revision)
        with self._open() as repo:
            if rev.kind == "commit":
                target: bytes | None = rev.name.encode() if rev.name.encode() in repo.object_store else None
            else:
                kinds = [rev.kind] if rev.kind else ["branch", "tag"]
                refs = [f"{checks.REF_PREFIXES[k]}{rev.name}".encode() for k in kinds]
                target = next((repo.refs[r] for r in refs if r in repo.refs), None)
            if target is not None:
                obj = repo.object_store[target]
                while isinstance(obj, Tag):
                    obj = repo.object_store[obj.object[1]]
                if isinstance(obj, Commit):
                    return obj.id.decode()
        raise not_found("RevisionNotFound", f"Invalid rev id: {revision}")

    def refs(self) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        """(branches, tags) as (name, commit); annotated tags are peeled to their commit."""
        with self._open() as repo:
            out = []
            for prefix in (b"refs/heads/", b"refs/tags/"):
                names = repo.refs.keys(prefix)
                out.append(sorted((n.decode(), repo.get_peeled(prefix + n).decode()) for n in names))
        return out[0], out[1]

    def commit_meta(self, commit: str) -> CommitMeta:
        with self._open() as repo:
            return _meta(repo[commit.encode()])

    def commits(self, commit: str, skip: int, limit: int) -> tuple[list[CommitMeta], bool]:
        """Commits reachable from `commit`, newest first: one page, and whether more follow."""
        with self._open() as repo:
            walker = Walker(repo.object_store, [commit.encode()], max_entries=skip + limit + 1)
            found = [_meta(entry.commit) for entry in walker]
        return found[skip:skip + limit], len(found) > skip + limit

    def last_commits(self, commit: str, paths: Sequence[str], *, budget: int = LAST_COMMITS_BUDGET,
                     cancelled: Callable[[], bool] = lambda: False) -> dict[str, CommitMeta]:
        """For each path (file or folder), the newest commit of first-parent history that changed it.

        One walk for all paths: each commit is read and diffed against its first parent once (dulwich's
        tree_changes skips every subtree whose id did not change, so a commit costs what it changed, not
        the size of the tree); a folder changed where anything below it did. The walk stops when every
        path is found, or when it has spent `budget` (one unit a commit plus one a changed entry): paths
        not found by then get no last commit (the Hub's `lastCommit` left out), so one request costs a
        bounded amount whatever the history. `cancelled` is asked before each commit; when it says yes
        (the server is stopping), the walk ends with 503.
        """
        wanted = set(paths)
        found: dict[str, CommitMeta] = {}
        spent = 0
        with self._open() as repo:
            store = repo.object_store
            current = repo[commit.encode()]
            while wanted and spent < budget:
                if cancelled():
                    raise HubError(503, "the server is shutting down")
                parent = repo[current.parents[0]] if current.parents else None
                changed: set[str] = set()
                for change in tree_changes(store, parent.tree if parent else None, current.tree):
                    spent += 1
                    changed.update(_with_folders((change.new.path or change.old.path).decode("utf-8", "replace")))
                spent += 1
                hit = wanted & changed
                if hit:
                    meta = _meta(current)
                    for path in hit:
                        found[path] = meta
                    wanted -= hit
                if parent is None:
                    break
                current = parent
        return found

    @staticmethod
    def _lookup(store, tree: bytes, path: str) -> tuple[int, bytes] | None:
        try:
            return store[tree].lookup_path(store.__getitem__, path.encode())
        except (KeyError, NotTreeError):
            return None

    def list_tree(self, commit: str, path: str = "", recursive: bool = False) -> list[Entry]:
        """Entries under `path` (the root when empty), trees before their contents as `git ls-tree -r -t`
        lists them; EntryNotFound when `path` is not a folder."""
        if path:
            checks.repo_path(path)
        with self._open() as repo:
            store = repo.object_store
            root = repo[commit.encode()].tree
            found = self._lookup(store, root, path) if path else (stat.S_IFDIR, root)
            if found is None or not stat.S_ISDIR(found[0]):
                raise not_found("EntryNotFound", f"{path} is not a folder at {commit}")
            entries: list[Entry] = []

            def walk(tree_id: bytes, prefix: str) -> None:
                tree = store[tree_id]
                assert isinstance(tree, Tree)
                for item in tree.iteritems():
                    name = f"{prefix}{item.path.decode('utf-8', 'replace')}"
                    entry = _entry(name, item.mode, item.sha, self.blobs.size)
                    if entry is None:
                        continue
                    entries.append(entry)
                    if recursive and entry.kind == "directory":
                        walk(item.sha, f"{name}/")

            walk(found[1], f"{path}/" if path else "")
        return entries

    def paths_info(self, commit: str, paths: Sequence[str]) -> list[Entry]:
        """The entries for exactly these paths; paths that do not exist are left out."""
        wanted = list(dict.fromkeys(checks.repo_path(p.strip("/")) for p in paths if p.strip("/")))
        out = []
        with self._open() as repo:
            root = repo[commit.encode()].tree
            for path in wanted:
                found = self._lookup(repo.object_store, root, path)
                entry = _entry(path, *found, self.blobs.size) if found else None
                if entry is not None:
                    out.append(entry)
        return out

    def all_files(self, commit: str, sizes: bool = True) -> list[Entry]:
        with self._open() as repo:
            items = list(repo.object_store.iter_tree_contents(repo[commit.encode()].tree))
        size_of = self.blobs.size if sizes else _no_size
        entries = (_entry(i.path.decode("utf-8", "replace"), i.mode, i.sha, size_of) for i in items)
        return [e for e in entries if e is not None]

    def file_entry(self, commit: str, path: str) -> Entry:
        found = self.paths_info(commit, [path])
        if not found or found[0].kind != "file":
            raise not_found("EntryNotFound", f"{path} does not exist at {commit}")
        return found[0]

    def blob_file(self, oid: str) -> Path:
        """A seekable plain file with the blob's content."""
        return self.blobs.path(oid)

    # -- writes (callers hold write_lock, except for add_blob) ----------------------------------
    def add_blob(self, data: bytes) -> str:
        """Store one file's content (a loose object, written through a unique temporary name) -> its git id.
        A commit that then fails leaves an unreferenced object, which `git gc` prunes."""
        blob = Blob.from_string(data)
        write_loose(self.path, blob)
        return blob.id.decode()

    def commit_changes(self, branch: str, message: str, description: str,
                       files: Iterable[tuple[str, str]], deleted_files: Iterable[str],
                       deleted_folders: Iterable[str], parent: str | None) -> tuple[str, bool]:
        """Apply deletions, then additions (path, blob id from add_blob), on top of `branch` as one
        commit -> (commit id, changed).

        The new tree is built from the head's file list (no index, no work tree); the branch then moves
        by compare-and-swap, so a concurrent writer gets a 409 instead of losing a commit.
        """
        branch = checks.ref_name(branch, "branch")
        ref = f"refs/heads/{branch}".encode()
        with self._open() as repo:
            store = repo.object_store
            if ref not in repo.refs:
                raise not_found("RevisionNotFound", f"branch {branch} does not exist")
            head = repo.refs[ref]
            if parent is not None and parent.encode() != head:
                raise HubError(412, f"parent commit {parent} is not the head of {branch} ({head.decode()})")
            head_commit = repo[head]
            flat = {i.path.decode("utf-8", "replace"): (i.mode, i.sha)
                    for i in store.iter_tree_contents(head_commit.tree)}
            for folder in deleted_folders:
                folder = checks.repo_path(folder.strip("/"), "deleted folder")
                inside = [p for p in flat if p.startswith(f"{folder}/")]
                if not inside:
                    raise not_found("EntryNotFound", f"A folder with this name doesn't exist: {folder}")
                for p in inside:
                    del flat[p]
            for name in deleted_files:
                name = checks.repo_path(name, "deleted file")
                if name not in flat:
                    raise not_found("EntryNotFound", f"A file with this name doesn't exist: {name}")
                del flat[name]
            for name, oid in files:
                name = checks.repo_path(name, "file path")
                _check_no_clash(flat, name)
                if oid.encode() not in store:
                    raise HubError(500, f"blob {oid} for {name} is not in the store")
                flat[name] = (_FILE_MODE, oid.encode())
            tree = commit_tree(LooseWriter(self.path), [(p.encode(), sha, mode) for p, (mode, sha) in flat.items()])
            if tree == head_commit.tree:
                return head.decode(), False
            text = message if not description else f"{message}\n\n{description}"
            commit = _new_commit(tree, [head], text)
            write_loose(self.path, commit)
            if not _ref_update(lambda: repo.refs.set_if_equals(ref, head, commit.id), f"branch {branch}"):
                raise HubError(409, f"branch {branch} moved while this commit was written; retry")
            return commit.id.decode(), True

    def create_ref(self, kind: str, name: str, commit: str, message: str | None = None) -> None:
        short = checks.ref_name(name, kind)
        ref = f"{checks.REF_PREFIXES[kind]}{short}".encode()
        with self._open() as repo:
            existing = {k: {n.decode() for n in repo.refs.keys(p.encode())} for k, p in checks.REF_PREFIXES.items()}
            if short in existing[kind]:
                raise HubError(409, f"{kind} {short} already exists")
            other = "tag" if kind == "branch" else "branch"
            if short in existing[other]:
                raise HubError(409, f"a {other} named {short} exists")
            clash = next((n for n in existing[kind] if n.startswith(f"{short}/") or short.startswith(f"{n}/")), None)
            if clash is not None:
                raise HubError(409, f"{kind} {short} clashes with the {kind} {clash} (one would hold the other)")
            target = commit.encode()
            if kind == "tag" and message:
                tag = Tag()
                tag.object = (Commit, target)
                tag.name = short.encode()
                tag.tagger = IDENTITY
                tag.tag_time, tag.tag_timezone = int(time.time()), 0
                tag.message = message.encode()
                write_loose(self.path, tag)
                target = tag.id
            try:
                created = _ref_update(lambda: repo.refs.add_if_new(ref, target), f"{kind} {short}")
            except OSError:  # a file/folder clash with a ref written meanwhile
                created = False
            if not created:
                raise HubError(409, f"{kind} {short} already exists")

    def move_branch(self, name: str, commit: str, expected: str | None) -> None:
        """Point branch `name` at `commit` in one step, only where it is now at `expected` (None: where it does not
        exist yet): a compare-and-swap, so the branch never disappears while it moves and a writer that read an
        older state gets a 412 instead of overwriting a newer move."""
        short = checks.ref_name(name, "branch")
        ref = f"refs/heads/{short}".encode()
        target = commit.encode()
        with self._open() as repo:
            if short in {n.decode() for n in repo.refs.keys(b"refs/tags/")}:
                raise HubError(409, f"a tag named {short} exists")
            current = repo.refs[ref] if ref in repo.refs else None  # noqa: SIM401 (no .get on dulwich refs)
            if current == target:
                return
            if (current.decode() if current is not None else None) != expected:
                raise HubError(412, f"branch {short} is at {current.decode() if current else 'nothing'}, "
                                    f"not {expected or 'nothing'}: it moved meanwhile")
            if current is None:
                moved = _ref_update(lambda: repo.refs.add_if_new(ref, target), f"branch {short}")
            else:
                moved = _ref_update(lambda: repo.refs.set_if_equals(ref, current, target), f"branch {short}")
            if not moved:
                raise HubError(412, f"branch {short} moved meanwhile; read it again")

    def delete_ref(self, kind: str, name: str) -> None:
        short = checks.ref_name(name, kind)
        ref = f"{checks.REF_PREFIXES[kind]}{short}".encode()
        with self._open() as repo:
            if ref not in repo.refs:
                raise not_found("RevisionNotFound", f"{kind} {short} does not exist")
            if kind == "branch" and short == "main":
                raise HubError(403, "the main branch cannot be deleted")
            if not _ref_update(lambda: repo.refs.remove_if_equals(ref, repo.refs[ref]), f"{kind} {short}"):
                raise HubError(409, f"{kind} {short} changed while being deleted; retry")


def _leftovers(git_dir: Path) -> Iterator[Path]:
    """The files a killed writer can leave in one bare repository (see GitStore.recover)."""
    for name in ("HEAD.lock", "packed-refs.lock", "config.lock"):
        yield git_dir / name
    yield from (git_dir / "objects").glob("[0-9a-f][0-9a-f]/*.lock")
    yield from (git_dir / "objects").glob(f"[0-9a-f][0-9a-f]/{TMP_OBJECT_PREFIX}*")
    yield from (p for p in (git_dir / "refs").rglob("*.lock"))
    yield from (git_dir / "kernel-hub" / "blobs").glob(".*.tmp")


def _running(pid: int) -> bool:
    """Whether process `pid` exists (this one included: its writes may be in flight on another thread)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def _ref_update(update: Callable[[], bool], what: str) -> bool:
    """Run one compare-and-swap on a ref. dulwich holds `<ref>.lock` while it writes; the server writes one repo
    at a time, so a lock found here is another program's or a killed server's (GitStore.recover clears those at
    start): a 503 that names the ref, never the store's path."""
    try:
        return update()
    except FileLocked:
        raise HubError(503, f"{what} is locked by another writer; retry (a lock left by a killed server is "
                            "cleared when the server restarts)") from None


def _check_no_clash(flat: dict[str, tuple[int, bytes]], name: str) -> None:
    """A file may not sit where a folder is, nor inside a path that is a file."""
    parts = name.split("/")
    for i in range(1, len(parts)):
        if "/".join(parts[:i]) in flat:
            raise HubError(409, f"cannot add {name}: {'/'.join(parts[:i])} is a file")
    if any(p.startswith(f"{name}/") for p in flat):
        raise HubError(409, f"cannot add {name}: it is a folder")


def _new_commit(tree: bytes, parents: list[bytes], message: str) -> Commit:
    commit = Commit()
    commit.tree, commit.parents = tree, parents
    commit.author = commit.committer = IDENTITY
    commit.author_time = commit.commit_time = int(time.time())
    commit.author_timezone = commit.commit_timezone = 0
    commit.encoding = b"UTF-8"
    commit.message = message.encode()
    return commit


class GitStore:
    """All repositories under one folder."""

    def __init__(self, root: Path):
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self._repos: dict[tuple[str, str], GitRepo] = {}
        self._lock = threading.Lock()

    def _path(self, repo_type: str, repo_id: str) -> Path:
        checks.repo_type(repo_type)
        namespace, _, name = repo_id.partition("/")
        checks.repo_id(namespace, name)
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
                raise HubError(409, f"You already created this {repo_type} repo: {repo_id}")
            tmp = path.with_name(f".{path.name}.creating-{uuid.uuid4().hex}")
            tmp.parent.mkdir(parents=True, exist_ok=True)
            try:
                repo = Repo.init_bare(str(tmp), mkdir=True, default_branch=b"main")
                try:
                    blob = Blob.from_string(_GITATTRIBUTES)
                    tree = Tree()
                    tree.add(b".gitattributes", _FILE_MODE, blob.id)
                    commit = _new_commit(tree.id, [], "initial commit")
                    for obj in (blob, tree, commit):
                        repo.object_store.add_object(obj)
                    repo.refs[b"refs/heads/main"] = commit.id
                finally:
                    repo.close()
                tmp.rename(path)  # appears complete or not at all
            finally:
                if tmp.exists():
                    safe_rmtree(self.root, tmp)
            repo_obj = self._repos[(repo_type, repo_id)] = GitRepo(path, repo_type, repo_id)
            return repo_obj

    def delete(self, repo_type: str, repo_id: str) -> None:
        repo = self.get(repo_type, repo_id)
        with self._lock:
            self._repos.pop((repo_type, repo_id), None)
            trash = repo.path.with_name(f".{repo.path.name}.deleting-{uuid.uuid4().hex}")
            repo.path.rename(trash)
            safe_rmtree(self.root, trash)

    def recover(self) -> list[Path] | None:
        """Clear what a killed server left in this store, before serving: git lock files (`objects/xx/*.lock`,
        `refs/**.lock`, `HEAD.lock`, `packed-refs.lock`, `config.lock`), our temporary object files and blob
        copies. Only plain files with those names, only inside the store's own repositories, only while this
        process holds the store's lock (STORE/.kernel-hub-serve.lock, held until the process ends: a second server
        on the same store gets None and clears nothing), and never a temporary file whose owner (the pid in its
        name) is still running. Returns what was removed."""
        if self.lock_for_writes() is not None:
            return None
        removed = []
        for repo_type in REPO_TYPES:
            for git_dir in sorted((self.root / f"{repo_type}s").glob("*/*.git")):
                if git_dir.is_symlink() or not git_dir.is_dir():
                    continue
                for path in _leftovers(git_dir):
                    if path.is_symlink() or not path.is_file() or self.root not in path.resolve().parents:
                        continue
                    owner = temp_owner(path.name)
                    if owner is not None and _running(owner):
                        continue  # a live writer's file in flight (an in-process app, another tool)
                    path.unlink(missing_ok=True)
                    removed.append(path)
        return removed

    def lock_for_writes(self) -> int | None:
        """Hold the store's lock for this process's lifetime -> None, or the pid of the live process holding it
        (0 when it cannot be read). Exclusive: one writing server per store; released when the process ends,
        however it ends (a kernel flock, so a killed server never leaves the store locked). The lock file is the
        store's own (files.open_private): a link, FIFO, device or hard link there is refused before anything is
        truncated or written, and a store that cannot be written is said to be so.

        Raises:
            KernelHubError: the lock file is not a plain file of the store's, or the store is not writable."""
        import fcntl

        if getattr(self, "_store_lock", None) is not None:
            return None
        path = self.root / STORE_LOCK
        try:
            fd = open_private(path, write=True)
        except OSError as exc:
            raise KernelHubError(f"the store {self.root} is not writable ({exc.strerror or exc}); serving with "
                                 "--token writes there: fix its permissions, or serve it read-only (without "
                                 "--token)") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return self.lock_owner() or 0
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._store_lock = fd
        return None

    def lock_owner(self) -> int | None:
        """The pid of the live process holding the store's lock, None when no process holds it (read-only look;
        a lock file that is not the store's own plain file, a FIFO say, is never waited on: None)."""
        import fcntl

        try:
            fd = open_private(self.root / STORE_LOCK, write=False)
        except (OSError, KernelHubError):
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                text = os.pread(fd, 32, 0).decode(errors="replace").strip()
                return int(text) if text.isdigit() and len(text) < 10 else 0
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)

    def repo_ids(self, repo_type: str, author: str) -> list[str]:
        """Every `author/NAME` repo of `repo_type` in the store, sorted (names checked before they are returned)."""
        base = self.root / f"{checks.repo_type(repo_type)}s" / checks.namespace(author)
        if not base.is_dir():
            return []
        found = []
        for p in sorted(base.glob("*.git")):
            try:
                found.append(checks.repo_id(author, p.name.removesuffix(".git")))
            except HubError:  # a folder the store did not make: not a repo
                continue
        return found

    def namespaces(self) -> set[str]:
        found = set()
        for repo_type in REPO_TYPES:
            base = self.root / f"{repo_type}s"
            if base.is_dir():
                found.update(p.name for p in base.iterdir() if p.is_dir() and any(p.glob("*.git")))
        return found

