"""Hostile build files, one clear KernelHubError each (never an internal error): zips (encrypted entries, compression
methods other than stored and deflate, corrupt deflate data, one name as a file and a folder, a zip bomb), tar
bundles (the same name clash), metadata.json (deep nesting, duplicate keys, kernel-depends that is not a list,
python-depends markers and a bound on their count), native code recognised by its bytes whatever its name, and a
short error for thousands of rejected variants."""

from __future__ import annotations

import io
import json
import tarfile
import tracemalloc
import zipfile
from pathlib import Path

import pytest

from kernel_hub.errors import IntegrityError, KernelHubError, MetadataError
from kernel_hub.package.buildfmt import strict_json, unpack_bundle
from kernel_hub.package.integrity import native_code_reason
from kernel_hub.sources.hub.builder import (
    MAX_PYTHON_DEPENDS,
    MAX_ZIP_RATIO,
    missing_python_depends,
    parse_builder_metadata,
    unzip_package,
)

BASE = {"name": "kb-relu", "id": "x", "version": 1, "license": "MIT", "backend": {"type": "cpu"}}
ELF = b"\x7fELF\x02\x01\x01" + b"\x00" * 57
MACHO = b"\xcf\xfa\xed\xfe" + b"\x00" * 60
PE = b"MZ" + b"\x00" * 58 + (0x80).to_bytes(4, "little") + b"\x00" * 0x40 + b"PE\x00\x00" + b"\x00" * 20


def zipped(entries: dict[str, bytes], method: int = zipfile.ZIP_DEFLATED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=method) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return buf.getvalue()


def _patched(data: bytes, local: int, central: int, value: int, only: bytes | None = None) -> bytes:
    """The zip with a 2-byte header field (at `local` in local headers, `central` in central ones) set to `value`,
    for every entry or the one whose name is `only`."""
    out = bytearray(data)
    for signature, offset, length_at, name_at in ((b"PK\x03\x04", local, 26, 30), (b"PK\x01\x02", central, 28, 46)):
        at = out.find(signature)
        while at >= 0:
            size = int.from_bytes(out[at + length_at:at + length_at + 2], "little")
            name = bytes(out[at + name_at:at + name_at + size])
            if only is None or name == only:
                out[at + offset:at + offset + 2] = value.to_bytes(2, "little")
            at = out.find(signature, at + 4)
    return bytes(out)


def _patched_method(data: bytes, method: int) -> bytes:
    return _patched(data, 8, 10, method)


def _encrypted() -> bytes:
    """An entry whose flags say it is encrypted (zipfile would ask for a password)."""
    return _patched(zipped({"__init__.py": b"", "_ops.py": b"x = 1\n"}), 6, 8, 0x1, only=b"_ops.py")


def _corrupt_deflate() -> bytes:
    body = b"".join(b"def f%d():\n    return %d\n" % (i, i) for i in range(400))
    data = bytearray(zipped({"__init__.py": b"", "_ops.py": body}))
    start = data.find(b"_ops.py") + len("_ops.py")  # the local header's name, then the deflate stream
    for i in range(start + 10, start + 60):
        data[i] ^= 0xA5
    return bytes(data)


@pytest.mark.parametrize(("make", "needle"), [
    (_encrypted, "is encrypted"),
    (lambda: _patched_method(zipped({"__init__.py": b"x = 1\n"}, zipfile.ZIP_STORED), 9),
     "compression method 9"),
    (_corrupt_deflate, "zip is damaged"),
    (lambda: zipped({"__init__.py": b"", "sub": b"x = 1\n", "sub/x.py": b""}), "both as a file and a folder"),
    (lambda: zipped({"__init__.py": b"", "sub/x.py": b"", "sub": b"x = 1\n"}), "both as a file and a folder"),
    (lambda: zipped({"__init__.py": b"", "_ops.txt": ELF}), "ELF"),
    (lambda: zipped({"__init__.py": b"", "helpers.py": MACHO}), "Mach-O"),
    (lambda: zipped({"__init__.py": PE}), "PE image"),
], ids=["encrypted", "method-9", "corrupt-deflate", "file-then-folder", "folder-then-file", "elf-as-txt",
        "macho-as-py", "pe-as-init"])
def test_a_hostile_zip_is_one_clear_error(make, needle: str) -> None:
    with pytest.raises(IntegrityError, match=needle):
        unzip_package(make(), "acme/x [torch-cpu]")


def test_a_zip_bomb_is_refused_in_bounded_memory() -> None:
    """0.5 MB of zip that inflates to 500 MiB: refused after MAX_ZIP_RATIO times its size, memory near one piece."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        archive.writestr("__init__.py", "")
        with archive.open("_ops.py", "w", force_zip64=True) as entry:
            block = b"\x00" * (8 << 20)
            for _ in range(500 // 8 + 1):
                entry.write(block)
    bomb = buf.getvalue()
    assert len(bomb) < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(IntegrityError, match=f"a zip may unpack to {MAX_ZIP_RATIO}x its size"):
            unzip_package(bomb, "acme/x [torch-cpu]")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, peak  # a whole-entry read would take 500 MiB


def _tar(members: list[tuple[str, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize(("members", "needle"), [
    ([("pkg/a", b"x"), ("pkg/a/b.py", b"")], "both as a file and a folder"),
    ([("pkg/a", b"x"), ("pkg/a", None)], "both as a file and a folder"),
    ([("pkg/_ops.txt", ELF)], "ELF"),
], ids=["file-then-child", "file-then-folder", "elf-as-txt"])
def test_a_hostile_bundle_is_one_clear_error(tmp_path: Path, members, needle: str) -> None:
    bundle = tmp_path / "b.tar"
    bundle.write_bytes(_tar(members))
    with pytest.raises(IntegrityError, match=needle):
        unpack_bundle(bundle, tmp_path / "out", "acme/x [jax-cpu]")


@pytest.mark.parametrize(("text", "error", "needle"), [
    (json.dumps(BASE)[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}", IntegrityError, "nested 100001 levels"),
    ('{"name": "kb-relu", "name": "kb-evil"}', IntegrityError, "names the key 'name' twice"),
    (json.dumps(BASE | {"kernel-depends": 5}), MetadataError, "kernel-depends must be a list, got int"),
    (json.dumps(BASE | {"python-depends": [f"pkg{i}" for i in range(20_000)]}), MetadataError,
     f"20000 python-depends \\(at most {MAX_PYTHON_DEPENDS}\\)"),
    ("[" * 5 + "]" * 5, IntegrityError, "not a JSON object"),
], ids=["deep", "duplicate-keys", "kernel-depends-int", "20000-python-depends", "not-an-object"])
def test_hostile_metadata_json_is_one_clear_error(text: str, error: type, needle: str) -> None:
    with pytest.raises(error, match=needle):
        parse_builder_metadata(text.encode(), "acme/x [torch-cpu]")


def test_strict_json_bounds_before_parsing() -> None:
    with pytest.raises(IntegrityError, match="larger than 10 bytes"):
        strict_json(b"[" + b" " * 20 + b"]", "t", 10)
    assert strict_json(b'{"a": [{"b": "[[[["}]}', "t", 100) == {"a": [{"b": "[[[["}]}  # brackets in strings: text
    escaped = b'{"a": "\\"' + b"[" * 40 + b'", "b": "\\\\"}'  # an escaped quote, then an escaped backslash
    assert strict_json(escaped, "t", 200) == {"a": '"' + "[" * 40, "b": "\\"}
    with pytest.raises(IntegrityError, match="nested 33 levels"):
        strict_json(b'{"a": "\\\\", "b": ' + b"[" * 32 + b"]" * 32 + b"}", "t", 200)


def test_python_depends_markers_are_honoured() -> None:
    have = {"einops": "0.8.0"}.get
    assert missing_python_depends(("helion; python_version < '3'",), have) is None  # not for this Python
    assert missing_python_depends(("einops; extra == 'never'",), have) is None
    needed = missing_python_depends(("helion; python_version >= '3'",), have)
    assert needed is not None and "pip install helion" in needed
    assert "at most" in missing_python_depends(tuple(f"p{i}" for i in range(MAX_PYTHON_DEPENDS + 1)), have)


@pytest.mark.parametrize(("head", "kind"), [(ELF, "ELF"), (MACHO, "Mach-O"), (PE, "PE"),
                                            (b"\xca\xfe\xba\xbe" + b"\x00" * 60, "Mach-O")])
def test_native_code_is_recognised_by_its_bytes(head: bytes, kind: str) -> None:
    reason = native_code_reason(head)
    assert reason is not None and kind in reason


@pytest.mark.parametrize("text", [b"MZ = 1\n" + b"x = 2\n" * 20, b"# ELF\n", b"import os\n", b""])
def test_python_source_is_not_native_code(text: bytes) -> None:
    assert native_code_reason(text) is None


def test_thousands_of_rejected_variants_make_a_short_error() -> None:
    from kernel_hub.decide.system import SystemFacts
    from kernel_hub.decide.variants import Choice, Decision
    from kernel_hub.decide.versions import Resolution
    from kernel_hub.load.planning import MAX_TRACE_LINES, Plan

    trace = tuple(Decision(f"torch-cpu-{i}", False, "built for another torch") for i in range(3000))
    plan = Plan(repo_id="acme/many", source=None, resolution=Resolution(commit="a" * 40, version="1.0.0", ref="v1",
                                                                          reason="t"),
                choice=Choice(None, trace), system=SystemFacts(backend="cpu"), framework="torch")
    message = str(plan.no_fit())
    lines = message.splitlines()
    assert len(lines) == MAX_TRACE_LINES + 2 and "3000 variants" in lines[0], lines[:3]
    assert "2990 more variants rejected" in lines[-1] and isinstance(plan.no_fit(), KernelHubError)
