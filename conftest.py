"""Set-up that must precede every import in the test session.

- Tests never reach the real Hub: anything not pointed at a test server goes to a closed loopback port, and
  caches go to throwaway folders, removed when the process exits. Set before huggingface_hub is imported (it reads
  these once).
- No test process reaches a host other than loopback: every proxy variable points at a loopback recorder
  (tests/client_env.py), the `hf` CLI's PyPI update check is off, every subprocess a test starts is checked to
  carry both, and a test fails if anything it ran tried to leave the machine.
- Load PyPI's `kernels` before any test module under kernels/pallas/ is imported: with --import-mode=importlib
  pytest names those modules `kernels.pallas.<k>.tests.test_x` and registers missing parents as empty
  modules, and an empty `kernels` would shadow HF's `kernels` for every later test.
- In-process JAX compiles run with XLA's CPU backend optimisation off (jax_disable_most_optimizations, set per
  module; never in the environment, so a subprocess, a TPU compile through libtpu included, keeps
  the defaults). The tests run small arrays, mostly through interpreted Pallas kernels whose programs are large:
  compiling is most of their time and LLVM's optimisation roughly half of that; the numbers checked do not depend
  on it.
- The TPU simulator's per-core programs (interpreted Pallas with several cores) are compiled once per program and
  test module, not once per core and call (tests/simulated_core_programs.py).
- Every module's compiled programs are dropped at its end (tests/compiled_programs.py): a worker that kept them
  ran out of memory mappings after a few thousand interpreted-kernel compiles and died in the next one.
- OpenMP threads sleep between parallel regions (OMP_WAIT_POLICY=PASSIVE, set before torch loads): two workers
  on two cores leave no core for a spinning thread.
- The heaviest test scopes run first (tests/schedule.py), so the suite's workers finish together, and a worker
  process that dies has its test run once more on a fresh worker, never a deadlocked run
  (tests/crash_safe_scheduling.py).
"""

import atexit
import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# OpenMP threads (torch's intra-op pool, MKL, oneDNN) sleep as soon as a parallel region ends instead of spinning:
# with two workers each running a thread per core, a spinning thread holds the core its partner needs to finish the
# next region, and tests of many small torch ops ran 3-8x slower for it. libgomp reads this once, when torch loads,
# so it is set before anything imports torch; subprocesses inherit it (they run beside the workers too). It changes
# where threads wait, nothing they compute; a value set by hand wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ["HF_ENDPOINT"] = "http://127.0.0.1:9"
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="kh-tests-hf-")
os.environ["KERNEL_HUB_CACHE"] = tempfile.mkdtemp(prefix="kh-tests-cache-")

if str(Path(__file__).parent) not in sys.path:  # `python -m pytest` from the root has it already
    sys.path.insert(0, str(Path(__file__).parent))
from tests import client_env, compiled_programs, schedule, simulated_core_programs

for _made in (os.environ["HF_HOME"], os.environ["KERNEL_HUB_CACHE"]):  # this process's own folders, gone at its exit
    atexit.register(shutil.rmtree, _made, True)

#: xdist's loadscope, made to finish when a worker process dies (tests/crash_safe_scheduling.py); the TPU
#: environment runs its checks in one process, without pytest-xdist
pytest_plugins = ["tests.crash_safe_scheduling"] if importlib.util.find_spec("xdist") else []

OUTSIDE = client_env.recorder()
os.environ.update(client_env.GUARDS)
os.environ.update(client_env.proxy_env(OUTSIDE.url))

with contextlib.suppress(ImportError):
    import kernels  # noqa: F401


@pytest.fixture(scope="module", autouse=True)
def _unoptimised_cpu_compiles():
    """XLA CPU compiles without backend optimisation for this module, then the setting it found; the TPU
    simulator's per-core programs compiled once each (simulated_core_programs), forgotten at the module's end, with
    every other compiled program (compiled_programs: a worker's code mappings would otherwise run out)."""
    import jax

    before = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)
    simulated_core_programs.install()
    yield
    simulated_core_programs.clear()
    jax.config.update("jax_disable_most_optimizations", before)
    compiled_programs.release()


_popen_init = subprocess.Popen.__init__
# Local tools that never open a socket and that kernel-hub runs on purpose with a minimal, stated environment
# (the native CPU kernel's compiler: PATH, TMPDIR, LC_ALL only), so they cannot carry the guards.
_OFFLINE_TOOLS = {"cc", "gcc", "clang", "c99"}


@pytest.fixture(autouse=True)
def _stays_on_loopback(monkeypatch: pytest.MonkeyPatch):
    """Every subprocess this test starts carries the guards; nothing it (or this process) did left loopback."""
    started = len(OUTSIDE.seen)

    def checked_init(self, args, *rest, **kwargs):
        env = kwargs.get("env")
        argv0 = Path(str(args[0] if isinstance(args, list | tuple) else args).split()[0]).name
        if argv0 in _OFFLINE_TOOLS or argv0.endswith(("-gcc", "-cc")):
            return _popen_init(self, args, *rest, **kwargs)
        missing = client_env.missing_guards(os.environ if env is None else env, OUTSIDE.url)
        if missing:
            raise AssertionError(f"a test subprocess {args!r} would run without {', '.join(missing)}: build its "
                                 "environment with tests/client_env.py child_env()")
        _popen_init(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", checked_init)
    yield
    sent = OUTSIDE.seen[started:]
    assert not sent, f"this test's processes tried to reach a host other than loopback: {sent!r}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Heaviest scopes first: with --no-loadscope-reorder, xdist hands scopes out in this order."""
    order = schedule.heaviest_first([item.nodeid for item in items], schedule.load())
    items[:] = [items[i] for i in order]
