"""One set-up for the interop tests (PyPI `kernels` against `kernel-hub serve`): a loopback server with kernels
published to it, and a runner for scripts in a fresh process pointed at it (HF kernels and huggingface_hub read
HF_ENDPOINT once, at import, so each client needs its own process)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernel_hub.publish.release import publish
from tests.hub_server import hub_env, hub_requests, running_server

TOKEN = "test-token"
KERNELS = Path(__file__).resolve().parents[1] / "kernels" / "pallas"


@dataclass
class InteropHub:
    """A running server, its scratch folder and the publish result of each repo published to it."""

    server: Any
    root: Path
    results: dict[str, Any] = field(default_factory=dict)

    def reset(self) -> None:
        """Forget the requests recorded so far (the next `requests()` counts from here)."""
        self.server.reset()

    def requests(self) -> list[tuple[str, str, Any]]:
        return hub_requests(self.server)

    def run(self, script: str, *, cache: str = "cache", **names: Any) -> Any:
        """Run `script` (with `names` bound as globals) against the server; its last stdout line parsed as JSON."""
        prelude = "".join(f"{k} = {v!r}\n" for k, v in names.items())
        proc = subprocess.run([sys.executable, "-c", prelude + script], env=hub_env(self.server, self.root / cache),
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])


@contextmanager
def published_hub(root: Path, kernels: dict[str, Path]) -> Iterator[InteropHub]:
    """`kernel-hub serve` on loopback with each {repo_id: kernel folder} published (validation and the TPU gate
    skipped: the interop tests check the numbers themselves, the kernels' own tests validate them). The server
    reports the published repos' organisations as trusted publishers, so HF `kernels` loads them unflagged."""
    orgs = sorted({repo_id.split("/")[0] for repo_id in kernels})
    trusted = tuple(arg for org in orgs for arg in ("--trusted-org", org))
    with running_server(root / "store", token=TOKEN, extra_args=trusted) as srv:
        hub = InteropHub(srv, root)
        for repo_id, folder in kernels.items():
            hub.results[repo_id] = publish(folder, repo_id=repo_id, endpoint=srv.url, token=TOKEN,
                                           skip_validation=True, skip_tpu_compile=True, log=lambda _: None)
        yield hub
