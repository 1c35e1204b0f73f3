"""Blobs as plain files, so that downloads and Range requests seek instead of reading a whole file.

Git keeps a blob zlib-compressed (a loose object) or delta-compressed in a pack: neither can be seeked.
The first read of a blob decompresses it, streaming and checking its git id on the way, into
`<repo>.git/kernel-hub/blobs/<oid>` (content-addressed, written once, renamed into place); every later
read seeks in that file. Sizes come from the loose object's header (a few bytes), never from the content.
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..names import check_commit
from .errors import HubError

if TYPE_CHECKING:
    from dulwich.objects import ShaFile

_CHUNK = 1 << 18


def loose_object(git_dir: Path, oid: str) -> Path:
    """Where git keeps object `oid` loose (it may be in a pack instead)."""
    check_commit(oid, "object id")  # 40 lowercase hex digits, like a commit id
    return git_dir / "objects" / oid[:2] / oid[2:]


def _read_header(stream, inflate) -> tuple[bytes, int, bytes]:
    """Inflate until the '<type> <size>\\0' header is complete -> (type, size, content bytes already out)."""
    out = b""
    while b"\0" not in out:
        chunk = inflate.unconsumed_tail or stream.read(64)
        if not chunk or len(out) > 64:
            raise HubError(500, "corrupt loose object header")
        out += inflate.decompress(chunk, 64)
    header, _, rest = out.partition(b"\0")
    kind, _, size = header.partition(b" ")
    return kind, int(size), rest


def loose_size(path: Path) -> int | None:
    """The size of a loose blob from its header, or None when it is not loose (or not a blob)."""
    try:
        with open(path, "rb") as stream:
            kind, size, _ = _read_header(stream, zlib.decompressobj())
    except FileNotFoundError:
        return None
    return size if kind == b"blob" else None


def _copy_loose(path: Path, oid: str, out) -> None:
    """Inflate a loose blob into `out` in bounded chunks, checking its git id on the way."""
    inflate = zlib.decompressobj()
    with open(path, "rb") as stream:
        kind, size, data = _read_header(stream, inflate)
        if kind != b"blob":
            raise HubError(500, f"object {oid} is a {kind.decode(errors='replace')}, not a blob")
        digest = hashlib.sha1(b"blob %d\0" % size)  # git's object id (integrity of the copy, not security)
        written = 0
        while data or not inflate.eof:
            digest.update(data)
            out.write(data)
            written += len(data)
            chunk = inflate.unconsumed_tail or stream.read(_CHUNK)
            if not chunk:
                break
            data = inflate.decompress(chunk, _CHUNK)
    if written != size or digest.hexdigest() != oid:
        raise HubError(500, f"object {oid} is corrupt in the store")


class BlobFiles:
    """The seekable copies of one repository's blobs."""

    def __init__(self, git_dir: Path, load_packed: Callable[[str], bytes]):
        self.git_dir = git_dir
        self.dir = git_dir / "kernel-hub" / "blobs"
        self._load_packed = load_packed  # for blobs in a pack: whole in memory (only after `git gc`)

    def size(self, oid: str) -> int:
        cached = self.dir / oid
        if cached.is_file():
            return cached.stat().st_size
        size = loose_size(loose_object(self.git_dir, oid))
        return size if size is not None else len(self._load_packed(oid))

    def path(self, oid: str) -> Path:
        """A plain file holding blob `oid`, made on first use."""
        target = self.dir / oid
        if target.is_file():
            return target
        self.dir.mkdir(parents=True, exist_ok=True)
        loose = loose_object(self.git_dir, oid)
        tmp = self.dir / f".{oid}.{temp_tag()}.tmp"
        try:
            with open(tmp, "wb") as out:
                if loose.is_file():
                    _copy_loose(loose, oid, out)
                else:
                    out.write(self._load_packed(oid))
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        return target


#: Prefix of the temporary files write_loose makes inside objects/xx/ (git's own are `tmp_obj_*`).
TMP_OBJECT_PREFIX = "tmp_obj_kh_"


def temp_tag() -> str:
    """The unique part of a temporary file's name: `p<owner pid>-<random>`, so recovery can tell a live writer's
    file (left alone) from a dead one's (removed)."""
    return f"p{os.getpid()}-{uuid.uuid4().hex}"


_OWNED = re.compile(rf"(?:{TMP_OBJECT_PREFIX}|\.[0-9a-f]+\.)p([0-9]{{1,10}})-[0-9a-f]+(?:\.tmp)?")


def temp_owner(name: str) -> int | None:
    """The pid in a temporary file's name (temp_tag), or None for a name without one."""
    found = _OWNED.fullmatch(name)
    return int(found.group(1)) if found else None


def write_loose(git_dir: Path, obj: ShaFile) -> None:
    """Write a git object (blob, tree, commit, tag) as a loose object through a unique temporary name, renamed
    into place in one step.

    dulwich writes through `<object>.lock` and refuses to write while that file exists, so a process killed
    mid-write left that content unwritable for good; a unique name never blocks another writer, and a killed
    write leaves only a temporary file that GitStore.recover removes at the next start. Two writers of the
    same object rename identical bytes: the last rename wins, and either way the object is whole.
    """
    oid = obj.id.decode()
    final = loose_object(git_dir, oid)
    if final.is_file():
        return
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f"{TMP_OBJECT_PREFIX}{temp_tag()}"
    try:
        with open(tmp, "wb") as out:
            out.write(obj.as_legacy_object())
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o444)  # git's loose objects are read-only
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)


class LooseWriter:
    """What dulwich.index.commit_tree needs of an object store (add_object), writing through write_loose."""

    def __init__(self, git_dir: Path):
        self.git_dir = git_dir

    def add_object(self, obj: ShaFile) -> None:
        write_loose(self.git_dir, obj)
