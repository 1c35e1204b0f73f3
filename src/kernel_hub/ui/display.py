"""What the command line prints of strings it did not write: a server's, a metadata file's, a kernel.yaml's.

A hostile string with ESC sequences, carriage returns, newlines or bidi overrides can redraw a terminal line
("compiled ... all good" over the real one). Every such string passes `clean` before it is printed: control and
format characters (C0, DEL, C1, Unicode Cf such as U+202E and the zero-width ones, line and paragraph separators)
become visible escapes (`\\x1b`, `\\u202e`), everything else is kept as it is.
"""

from __future__ import annotations

import unicodedata
from typing import Any

__all__ = ["clean", "clean_data", "clean_lines", "one_line"]

_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def clean(text: object) -> str:
    """`text` as one printable line: every control or format character escaped (newlines included)."""
    s = str(text)
    if s.isprintable():  # the common case: nothing to do
        return s
    return "".join(_escape(c) if unicodedata.category(c) in _UNSAFE_CATEGORIES else c for c in s)


def one_line(text: object, limit: int | None = 300) -> str:
    """A message from anywhere (a server, a metadata file) as one printable line: its non-blank lines joined,
    then `clean`, so a hostile string can neither break the line nor redraw the terminal.

    Args:
        text: the message; anything `str` accepts.
        limit: the longest line returned (cut to end in "..."); None: no cut.

    Returns:
        The line; "" when `text` has only blank lines.
    """
    flat = clean(" ".join(line.strip() for line in str(text).splitlines() if line.strip()))
    return flat if limit is None or len(flat) <= limit else flat[:limit - 3] + "..."


def clean_lines(text: str) -> str:
    """Text the CLI built line by line: each line cleaned, the newlines between them kept."""
    return "\n".join(clean(line) for line in text.split("\n"))


def clean_data(data: object) -> Any:
    """Every string in nested dicts, lists and tuples cleaned (keys too): data shown as text."""
    if isinstance(data, str):
        return clean(data)
    if isinstance(data, dict):
        return {clean_data(k): clean_data(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return type(data)(clean_data(v) for v in data)
    return data
