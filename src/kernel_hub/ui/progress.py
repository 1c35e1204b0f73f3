"""Live progress for long commands (validate, download, publish, report): rows as work finishes, a bar below.

On a terminal it is rich's progress bar with each finished row printed above it; anywhere else (a pipe, a
file, CI) the same rows as plain lines, flushed as they come, so a log shows what ran and what is running.
`--json` commands keep stdout for the JSON: their progress goes to stderr, and only when that is a terminal.
Without rich installed, plain lines everywhere.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO


class Progress:
    """Where a command reports progress: `phase` starts a counted (or open-ended) piece of work, `row` prints
    a finished item, `advance` moves the bar. The base class prints nothing (--json without a terminal)."""

    def phase(self, description: str, total: int | None = None, *, announce: bool = True) -> None:
        """Start a piece of work of `total` steps (None: unknown); announce=False: only the live bar names it
        (the rows already say what runs)."""

    def advance(self, steps: int = 1) -> None:
        """`steps` more done in the current phase."""

    def row(self, text: str, *, ok: bool | None = None) -> None:
        """A finished item (ok: True pass, False fail, None neutral)."""

    def close(self) -> None:
        """Stop the live display (rows stay)."""


class PlainProgress(Progress):
    """Plain lines: one per row, and a line when a phase starts."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def _print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def phase(self, description: str, total: int | None = None, *, announce: bool = True) -> None:
        if announce:
            self._print(f"{description} ({total})" if total is not None else description)

    def row(self, text: str, *, ok: bool | None = None) -> None:
        self._print(text)


class RichProgress(Progress):
    """rich's bar (spinner, count, elapsed) on a terminal, rows printed above it."""

    def __init__(self, stream: TextIO) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as Bar

        self.console = Console(file=stream, highlight=False)
        # markup off: a description such as "fetching [torch-cpu]" is text, not a style tag
        self.bar = Bar(SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(),
                       MofNCompleteColumn(), TimeElapsedColumn(), console=self.console, transient=True)
        self.task: Any = None
        self.bar.start()

    def phase(self, description: str, total: int | None = None, *, announce: bool = True) -> None:
        if self.task is not None:
            self.bar.remove_task(self.task)
        self.task = self.bar.add_task(description, total=total)

    def advance(self, steps: int = 1) -> None:
        if self.task is not None:
            self.bar.advance(self.task, steps)

    def row(self, text: str, *, ok: bool | None = None) -> None:
        from rich.text import Text

        style = {True: None, False: "bold red", None: None}[ok]
        self.console.print(Text(text, style=style))

    def close(self) -> None:
        self.bar.stop()


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def make_progress(*, json_output: bool = False, stream: TextIO | None = None) -> Progress:
    """The progress a command should show: rich on a terminal, plain lines on a pipe, none for --json unless
    stderr is a terminal."""
    if json_output:
        stream = stream or sys.stderr
        if not _is_tty(stream):
            return Progress()
    stream = stream or sys.stdout
    if _is_tty(stream):
        try:
            return RichProgress(stream)
        except ImportError:  # rich is optional for the library; plain lines do the job
            pass
    return PlainProgress(stream)


@contextmanager
def progress(*, json_output: bool = False, stream: TextIO | None = None) -> Iterator[Progress]:
    """make_progress as a context: the live display stops however the block ends."""
    p = make_progress(json_output=json_output, stream=stream)
    try:
        yield p
    finally:
        p.close()
