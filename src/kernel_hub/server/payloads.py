"""Request bodies, parsed and checked before a handler sees them: JSON bodies as pydantic models, the
commit API's NDJSON lines, and base64 file contents. Anything malformed is a 400 naming what is wrong,
never an exception a handler trips on (a 500), and never a silently empty file.
"""

from __future__ import annotations

import binascii
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qs

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from . import checks
from .errors import HubError

if TYPE_CHECKING:
    from ..json_types import JsonDict, JsonValue

_MAX_FILES = 10_000


class Body(BaseModel):
    """A JSON object from a client: unknown keys ignored, known keys strictly typed."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)


class RepoRef(Body):
    """`POST /api/repos/create` and `DELETE /api/repos/delete`."""

    name: str
    organization: str | None = None
    type: str | None = None

    def repo(self) -> tuple[str, str]:
        """(repo type, ORG/NAME), both checked."""
        if not self.organization:
            raise HubError(400, "this store keeps repos under an organization: name the repo ORG/NAME")
        return checks.repo_type(self.type or "model"), checks.repo_id(self.organization, self.name)


class PreuploadFile(Body):
    path: str


class Preupload(Body):
    files: list[PreuploadFile] = Field(max_length=_MAX_FILES)


class PathsInfo(Body):
    paths: list[str] | str = Field(default_factory=list)
    expand: bool = False


class BranchCreate(Body):
    startingPoint: str | None = None  # the Hub's field name
    # kernel-hub's extension: move the branch in one step (compare-and-swap) where it is now at expectedCommit
    # (null: where it does not exist); publish uses it so a branch never disappears while it moves.
    move: bool = False
    expectedCommit: str | None = None


class TagCreate(Body):
    tag: str
    message: str | None = Field(default=None, max_length=65536)


def _no_nul(value: str) -> str:
    if "\0" in value:
        raise ValueError("may not contain NUL characters")
    return value


class CommitHeader(Body):
    summary: str = Field(min_length=1, max_length=4096)
    description: str = Field(default="", max_length=65536)
    parentCommit: str | None = None

    _text = field_validator("summary", "description")(_no_nul)


class FileOperation(Body):
    path: str
    content: str
    encoding: str = "base64"


class PathOperation(Body):
    path: str


class CommitLine(Body):
    key: str
    value: dict[str, Any]


M = TypeVar("M", bound=BaseModel)


def _first_problem(exc: ValidationError) -> str:
    err = exc.errors(include_url=False)[0]
    where = ".".join(str(p) for p in err["loc"]) or "body"
    return f"{where}: {err['msg']}"


def parse(model: type[M], data: JsonValue, what: str) -> M:
    """`data` (parsed JSON) as `model`, or a 400 naming the first problem."""
    if not isinstance(data, dict):
        raise HubError(400, f"{what} must be a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise HubError(400, f"{what}: {_first_problem(exc)}") from None


def load_json(raw: bytes, what: str) -> JsonValue:
    """Parse a JSON document; an empty body is {} (clients send none where every field is optional)."""
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: a body nested thousands deep
        raise HubError(400, f"{what} is not valid JSON") from None


def load_form(raw: bytes) -> JsonDict:
    """An x-www-form-urlencoded body (huggingface_hub's paths-info) as a JSON-like dict."""
    form = parse_qs(raw.decode("utf-8", "replace"), keep_blank_values=True)
    out: JsonDict = {"paths": form.get("paths", [])}
    if "expand" in form:
        out["expand"] = form["expand"][-1].lower() in ("1", "true", "yes")
    return out


def decode_base64(content: str, path: str) -> bytes:
    """Canonical base64, as every client encodes it (alphabet, padding, no trailing bits or junk); anything
    else is a 400, never a file silently shorter than what was sent (or empty)."""
    try:
        data = binascii.a2b_base64(content.encode("ascii"), strict_mode=True)
    except (ValueError, binascii.Error):
        data = None
    if data is None or binascii.b2a_base64(data, newline=False) != content.encode("ascii"):
        raise HubError(400, f"content of {path} is not valid base64")
    return data


@dataclass
class CommitRequest:
    """What one commit asks for, every path checked and every file decoded."""

    header: CommitHeader
    files: list[tuple[str, str]] = field(default_factory=list)  # (path, id of the stored blob)
    deleted_files: list[str] = field(default_factory=list)
    deleted_folders: list[str] = field(default_factory=list)


def parse_commit(lines: Iterable[bytes], store_blob: Callable[[bytes], str]) -> CommitRequest:
    """The commit API's NDJSON: one {"key": "header"} line, then file / deletedFile / deletedFolder lines.

    Each file is decoded and handed to `store_blob` as its line is read, so a large commit holds one
    file in memory at a time, not all of them.
    """
    header: CommitHeader | None = None
    files: list[tuple[str, str]] = []
    deleted_files: list[str] = []
    deleted_folders: list[str] = []
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        what = f"commit line {number}"
        line = parse(CommitLine, load_json(raw, what), what)
        if line.key == "header":
            if header is not None:
                raise HubError(400, f"{what}: a commit has one header")
            header = parse(CommitHeader, line.value, f"{what} (header)")
        elif line.key == "file":
            op = parse(FileOperation, line.value, f"{what} (file)")
            path = checks.repo_path(op.path, "file path")
            if op.encoding != "base64":
                raise HubError(400, f"{what}: unsupported encoding {op.encoding[:40]!r} (only base64)")
            files.append((path, store_blob(decode_base64(op.content, path))))
        elif line.key in ("deletedFile", "deletedFolder"):
            op2 = parse(PathOperation, line.value, f"{what} ({line.key})")
            if line.key == "deletedFile":
                deleted_files.append(checks.repo_path(op2.path, "deleted file"))
            else:
                deleted_folders.append(checks.repo_path(op2.path.strip("/"), "deleted folder"))
        elif line.key == "lfsFile":
            raise HubError(400, "LFS uploads are not supported by this store (preupload answers 'regular')")
        else:
            raise HubError(400, f"{what}: unknown commit operation {line.key[:40]!r}")
        if len(files) + len(deleted_files) + len(deleted_folders) > _MAX_FILES:
            raise HubError(400, f"a commit may hold at most {_MAX_FILES} operations")
    if header is None:
        raise HubError(400, "a commit needs a header line with a summary")
    return CommitRequest(header, files, deleted_files, deleted_folders)
