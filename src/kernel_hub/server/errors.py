"""One error type for the server, and the one way it becomes an HTTP answer.

Every refusal is a HubError with a 4xx status (or 5xx for a real bug); the answer carries the Hub's
X-Error-Message / X-Error-Code headers, which huggingface_hub turns into its exceptions. Messages often
quote what the client sent, so the header is always one sanitised ASCII line: a CR, LF or NUL in a header
would make the HTTP layer drop the connection instead of answering.
"""

from __future__ import annotations

import re

from starlette.responses import JSONResponse, Response

#: Longest X-Error-Message header; the JSON body keeps a longer copy.
HEADER_LIMIT = 300
BODY_LIMIT = 2000
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


class HubError(Exception):
    """A request the server refuses: HTTP status, a one-line message, the Hub's error code, extra headers."""

    def __init__(self, status: int, message: str, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, dict(headers or {})


#: The store's errors are the server's errors (kept as a name for importers of the old store API).
StoreError = HubError


def not_found(code: str, message: str) -> HubError:
    return HubError(404, message, code)


def header_line(text: str, limit: int = HEADER_LIMIT) -> str:
    """`text` as one printable ASCII line of at most `limit` characters (safe for any HTTP header)."""
    line = _CONTROL.sub(" ", text).encode("ascii", "replace").decode("ascii").strip()
    return line if len(line) <= limit else line[: limit - 3] + "..."


def error_response(status: int, message: str, code: str | None = None,
                   headers: dict[str, str] | None = None, body: dict | None = None) -> Response:
    """The Hub's error answer: JSON {"error": ...} plus X-Error-Message (and X-Error-Code)."""
    out = {**(headers or {}), "X-Error-Message": header_line(message)}
    if code:
        out["X-Error-Code"] = header_line(code, 80)
    text = message.encode("utf-8", "replace").decode("utf-8")  # no lone surrogates from a JSON body
    text = text if len(text) <= BODY_LIMIT else text[: BODY_LIMIT - 3] + "..."
    return JSONResponse({"error": text, **(body or {})}, status_code=status, headers=out)


def from_error(exc: HubError) -> Response:
    return error_response(exc.status, exc.message, exc.code, exc.headers)
