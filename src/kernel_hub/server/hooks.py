"""Test hooks (`kernel-hub serve --test-hooks` only): faults a test injects into matching requests.

The request log and the routes that read and set these live with the server state in app.py; they exist
only with --test-hooks, need the read token when reads need one, and the token to change anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field

from .payloads import Body


@dataclass
class Fault:
    """A test hook: make matching requests fail, stall or get cut off half-way."""

    match: str
    method: str | None = None
    status: int | None = None
    delay: float = 0.0
    truncate: bool = False
    times: int = 1

    def applies(self, method: str, path: str, body_stage: bool) -> bool:
        return (self.times > 0 and self.match in path and self.truncate == body_stage
                and (self.method is None or self.method == method))


class FaultSpec(Body):
    match: str
    method: str | None = None
    status: int | None = Field(default=None, ge=400, le=599)
    delay: float = Field(default=0.0, ge=0, le=60)
    truncate: bool = False
    times: int = Field(default=1, ge=1, le=10_000)


class FaultsBody(Body):
    add: list[FaultSpec] = Field(default_factory=list, max_length=100)
    clear: bool = False
