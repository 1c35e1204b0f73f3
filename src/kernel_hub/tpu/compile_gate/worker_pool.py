"""The compile gate's requests to the TPU worker: the generations of a compile split over a few worker processes at
once, each run restarted after a crash with the cases it had left.

A compiler that kills the process (abort, segfault) fails only the case it was compiling: the case is marked failed
with the exit status and the last line of stderr, then a fresh worker takes the cases left. A worker that refuses
the kernel package (a file differs from the digests the parent verified) stops the whole request with that error.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from ..env import TpuEnv, TpuEnvironmentError
from ..package import VerifiedPackage
from ..worker_client import Runner, default_jobs, last_line, refusal, run_worker

if TYPE_CHECKING:
    from ...json_types import JsonDict

#: Restarts after a crash before the rest of the request is given up (each costs one case).
MAX_RESTARTS = 8


def _compile_generations(env: TpuEnv, package: VerifiedPackage, generations: tuple[str, ...],
                         names: list[str] | None, tags: list[str] | None, run: Runner) -> tuple[list[str] | None,
                                                                                               dict]:
    """(case order, (generation, name) -> result) of one worker chain over `generations`, restarting after a crash
    with the cases left (a crash costs only the case it hit)."""
    results: dict[tuple[str, str], JsonDict] = {}
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
                    f"the TPU compile worker failed (exit {status}) before compiling anything: {last_line(stderr)}"
                )
            key = (started[-1]["generation"], started[-1]["name"])
            results.setdefault(key, {"event": "result", "generation": key[0], "name": key[1], "passed": False,
                                     "compile_seconds": None,
                                     "error": f"compiler process died (exit {status}): {last_line(stderr)}"})
    return order, results


def compile_in_worker(
    env: TpuEnv,
    package: VerifiedPackage,
    generations: tuple[str, ...],
    *,
    names: list[str] | None = None,
    tags: list[str] | None = None,
    jobs: int | None = None,
    run: Runner = run_worker,
    on_event: Callable[[JsonDict], None] | None = None,
) -> list[JsonDict]:
    """Result records ({"generation", "name", "passed", ...}) for every (generation, case) selected by
    `names` / `tags` (None: all), in generation then case order. The generations are split over `jobs`
    worker processes run at once; each worker imports only `package`'s verified files (IntegrityError or
    KernelImportError, one line, when it refuses them). `on_event`: each worker event as it is written (live
    progress; `run` must take it as a keyword)."""
    if on_event is not None:
        run = functools.partial(run, on_event=on_event)
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
