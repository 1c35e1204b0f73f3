"""Files kernel-hub reads or writes beside the user's own (lock files, pyproject.toml, a store's lock): a read is
bounded by bytes actually read (never by what stat says), a FIFO or device never hangs or floods a read, and a write
never goes through a link onto a file elsewhere.

`read_capped` reads a small text file that may be anything: only a regular file (a link to one is fine), at most
`cap` bytes. `write_atomic` replaces a file in one rename from a temporary file beside it, refusing a link or
anything but a regular file at the target. `open_private` opens a file a process keeps for itself (a lock): no
link followed, no FIFO waited on, no hard link written through.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import uuid
from pathlib import Path

from .errors import MetadataError


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def read_capped(path: Path, cap: int, what: str) -> bytes:
    """The bytes of `path`, a regular file (through links) of at most `cap` bytes: at most cap + 1 bytes are ever
    read, and a FIFO, a device or a folder is refused before any read (opened non-blocking, so a FIFO with no writer
    never hangs the open).

    Raises:
        FileNotFoundError: no such file (the caller says what to create).
        MetadataError: a folder, FIFO, device or socket, over `cap` bytes, or unreadable (one line naming `path`).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise MetadataError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise MetadataError(f"{path} is {_kind(mode)}, not {what} (a regular file)")
        chunks, total = [], 0
        while total <= cap:
            chunk = os.read(fd, min(1 << 20, cap + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as exc:
        raise MetadataError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if total > cap:
        raise MetadataError(f"{path}: larger than {cap} bytes; not {what}")
    return b"".join(chunks)


def read_capped_text(path: Path, cap: int, what: str) -> str:
    """read_capped decoded as UTF-8 (MetadataError where it is not text)."""
    try:
        return read_capped(path, cap, what).decode()
    except UnicodeDecodeError:
        raise MetadataError(f"{path}: not a text file; not {what}") from None


def check_writable(path: Path, what: str) -> None:
    """Refuse a link, a folder, a FIFO or a device at `path`; callers writing several files check them all
    first so a refusal leaves nothing written.

    Raises:
        MetadataError: what is at `path` is not a regular file (one line).
    """
    path = Path(path)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise MetadataError(f"cannot write {what} {path}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(mode):
        raise MetadataError(f"{path} is a link; not writing {what} through it (remove the link, or name the file "
                            "it points to)")
    if not stat.S_ISREG(mode):
        raise MetadataError(f"{path} is {_kind(mode)}; not writing {what} over it")


def write_atomic(path: Path, data: bytes, what: str) -> None:
    """Replace `path` with `data` in one rename from a temporary file in the same folder: a reader sees the old
    file or the new one. A link, a folder, a FIFO or a device at `path` is refused (the write would land
    elsewhere or replace something that is not this file); nothing is left behind on failure.

    Raises:
        MetadataError: what is at `path` is not a regular file, or the folder cannot be written (one line).
    """
    path = Path(path)
    check_writable(path, what)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise MetadataError(f"cannot write {what} {path}: {exc.strerror or exc}") from None


class NotPrivateFileError(MetadataError):
    """A file a process keeps for itself (a lock) is a link, a FIFO, a device or has another name (a hard link)."""


def open_private(path: Path, *, write: bool) -> int:
    """A file descriptor on `path`, a file this process keeps for itself (created 0644 when `write`): a link at
    `path` is not followed, a FIFO or device is refused without waiting on it, and a file with a second name (a
    hard link) is refused before anything is written, so a truncate or a write never reaches a file elsewhere.

    Raises:
        FileNotFoundError: read-only and no file there. NotPrivateFileError: a link, FIFO, device, folder or hard
        link. OSError: other failures (a read-only folder: PermissionError, EROFS), for the caller to word.
    """
    flags = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_RDWR | os.O_CREAT if write else os.O_RDONLY)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if isinstance(exc, IsADirectoryError):
            raise NotPrivateFileError(f"{path} is a folder; remove it (this file is kernel-hub's own)") from None
        if exc.errno == errno.ELOOP:
            raise NotPrivateFileError(f"{path} is a link; remove it (this file is kernel-hub's own)") from None
        raise
    info = os.fstat(fd)
    problem = None if stat.S_ISREG(info.st_mode) else _kind(info.st_mode)
    if problem is None and info.st_nlink != 1:
        problem = f"a file with {info.st_nlink} names (a hard link)"
    if problem is not None:
        os.close(fd)
        raise NotPrivateFileError(f"{path} is {problem}; remove it (this file is kernel-hub's own)")
    os.set_blocking(fd, True)
    return fd
