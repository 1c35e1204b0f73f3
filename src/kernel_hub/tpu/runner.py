"""Drive the worker (worker.py) in the TPU environment's Python and read its events back.

One subprocess per request (the generations of a compile split over a few at once). A compiler that kills the
process (abort, segfault) fails only the case it was compiling: the runner marks that case failed with the exit
status and the last line of stderr, then starts a fresh worker for the cases left. A worker that refuses the
kernel package (a file differs from the digests the parent verified) stops the whole request with that error.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..errors import IntegrityError, KernelHubError, KernelImportError
from .env import CHECKOUT, TpuEnv, TpuEnvironmentError
from .package import VerifiedPackage

#: Restarts after a crash before the rest of the request is given up (each costs one case).
MAX_RESTARTS = 8


def _read_events(path: Path) -> list[dict[str, Any]]:
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:  # a line cut by a crash
            continue
    return events


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


Runner = Callable[..., tuple[list[dict[str, Any]], int, str]]


def run_worker(env: TpuEnv, request: dict[str, Any], *, timeout: float = 1800) -> tuple[list[dict[str, Any]], int, str]:
    """(events, exit status, stderr) of one worker run for `request`."""
    with tempfile.TemporaryDirectory(prefix="kernel_hub_tpu_") as tmp:
        req_path, events_path = Path(tmp) / "request.json", Path(tmp) / "events.jsonl"
        req_path.write_text(json.dumps(request))
        events_path.touch()
        child_env = dict(os.environ)
        if CHECKOUT is not None:  # the checkout's kernel_hub importable where the TPU Python has not installed it
            rest = child_env.get("PYTHONPATH")
            child_env["PYTHONPATH"] = str(CHECKOUT / "src") + (os.pathsep + rest if rest else "")
        child_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        # libtpu takes a machine-wide lock (/tmp/libtpu_lockfile) meant for real chips; compiling for mock
        # ones needs no exclusivity, so two validations (or a test and a bench) may run at once
        child_env.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        try:
            done = subprocess.run(
                [str(env.python), "-m", "kernel_hub.tpu.worker", str(req_path), str(events_path)],
                capture_output=True, text=True, timeout=timeout, env=child_env, cwd=tmp,
            )
        except subprocess.TimeoutExpired as exc:
            stderr = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            return _read_events(events_path), -1, stderr + f"\ntimed out after {timeout:.0f} s"
        except OSError as exc:
            raise TpuEnvironmentError(f"cannot run the TPU environment's Python {env.python}: {exc}") from None
        return _read_events(events_path), done.returncode, done.stderr


def refusal(events: list[dict[str, Any]]) -> KernelHubError | None:
    """The error a worker reported for a package it refused to run (tampered files, a failing import)."""
    for e in events:
        if e.get("event") == "refused":
            kind = IntegrityError if e.get("kind") == "integrity" else KernelImportError
            return kind(str(e.get("error") or "the TPU worker refused the kernel package")[:400])
    return None


def _compile_generations(env: TpuEnv, package: VerifiedPackage, generations: tuple[str, ...],
                         names: list[str] | None, tags: list[str] | None, run: Runner) -> tuple[list[str] | None,
                                                                                               dict]:
    """(case order, (generation, name) -> result) of one worker chain over `generations`, restarting after a crash
    with the cases left (a crash costs only the case it hit)."""
    results: dict[tuple[str, str], dict[str, Any]] = {}
    order = list(names) if names is not None else None
    for _ in range(MAX_RESTARTS + 1):
        todo: dict[tuple[str, ...] | None, list[str]] = {}
        for g in generations:
            left = None if order is None else tuple(n for n in order if (g, n) not in results)
            if left is None or left:
                todo.setdefault(left, []).append(g)
        if not todo:
            break
        for left, gens in todo.items():
            request = {"mode": "compile", "package": package.request(), "generations": gens,
                       "cases": None if left is None else list(left), "tags": tags}
            events, status, stderr = run(env, request)
            refused = refusal(events)
            if refused is not None:
                raise refused
            for e in events:
                if e.get("event") == "cases" and order is None:
                    order = list(e["names"])
                elif e.get("event") == "result":
                    results[(e["generation"], e["name"])] = e
            if status == 0 and any(e.get("event") == "done" for e in events):
                continue
            started = [e for e in events if e.get("event") == "start"]
            if not started:  # died before any case: the environment is broken
                raise TpuEnvironmentError(
                    f"the TPU compile worker failed (exit {status}) before compiling anything: {_last_line(stderr)}"
                )
            key = (started[-1]["generation"], started[-1]["name"])
            results.setdefault(key, {"event": "result", "generation": key[0], "name": key[1], "passed": False,
                                     "compile_seconds": None,
                                     "error": f"compiler process died (exit {status}): {_last_line(stderr)}"})
    return order, results


def default_jobs(generations: int) -> int:
    """Compiler processes at once: one per generation, at most one per CPU (libtpu compiles a case on one
    thread; measured in the README's compile-gate table)."""
    return max(1, min(generations, os.cpu_count() or 1))


def compile_in_worker(
    env: TpuEnv,
    package: VerifiedPackage,
    generations: tuple[str, ...],
    *,
    names: list[str] | None = None,
    tags: list[str] | None = None,
    jobs: int | None = None,
    run: Runner = run_worker,
) -> list[dict[str, Any]]:
    """Result records ({"generation", "name", "passed", ...}) for every (generation, case) selected by
    `names` / `tags` (None: all), in generation then case order. The generations are split over `jobs`
    worker processes run at once; each worker imports only `package`'s verified files (IntegrityError or
    KernelImportError, one line, when it refuses them)."""
    jobs = default_jobs(len(generations)) if jobs is None else max(1, min(jobs, len(generations)))
    chunks = [tuple(generations[i::jobs]) for i in range(jobs)]
    if jobs == 1:
        outcomes = [_compile_generations(env, package, chunks[0], names, tags, run)]
    else:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            outcomes = list(pool.map(lambda gens: _compile_generations(env, package, gens, names, tags, run), chunks))
    order = next((o for o, _ in outcomes if o is not None), None)
    results = {k: v for _, found in outcomes for k, v in found.items()}
    return [results[(g, n)] for g in generations for n in (order or []) if (g, n) in results]
