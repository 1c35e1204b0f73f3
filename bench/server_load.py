"""`kernel-hub serve` under load, and killed mid-write: what a restart finds.

    python bench/server_load.py [--threads 8] [--requests 50] [--writers 2] [--json out.json]

1. Load: THREADS threads x REQUESTS operations against one kernel repo on a real `kernel-hub serve` (a subprocess
   on loopback): WRITERS of the threads commit a small file each time (huggingface_hub's create_commit), the others
   read (refs, tree listing, a 256 KiB file download, in turn). Reports operations/s and HTTP requests/s, the
   server's RSS before and after, and the commits acknowledged that the repo's history does not hold afterwards
   ("lost": 0 expected).
2. SIGKILL mid-commit: a 48 MiB commit is sent and the server killed while it writes it; then restarted. Reports
   the lock and temporary files the kill left, what the restart cleared, `git fsck`, and that a commit of that same
   content then works (before the fix: 503 for ever).
3. SIGKILL mid-publish: `publish` of 1.1.0 over 1.0.0, the server killed the moment tag v1.1.0 exists (before v1
   moves: the window where a delete+create move lost v1). Reports whether v1 still resolved after the restart, and
   where a re-run of publish left v1.
4. A second `serve --token` on the live store: its exit code and the line it printed (refused: one writer per
   store), and whether the first server still commits afterwards.
5. Two publishes of one version with different content, started together, ROUNDS times: how many rounds had one
   winner and one refusal, and in how many main, tag vX.Y.Z and branch v<N> all held the winner's commit.
Prints one table and (with --json) writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

TOKEN = "bench-token"
REPO = "bench/load"
KERNEL_REPO = "bench/toy"


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Server:
    """`kernel-hub serve` as a subprocess on a free loopback port."""

    def __init__(self, store: Path):
        self.store = store
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.log = store.parent / "serve.log"

    def start(self) -> None:
        cmd = [sys.executable, "-m", "kernel_hub.cli", "serve", "--store", str(self.store), "--host", "127.0.0.1",
               "--port", "0", "--token", TOKEN]
        env = {**os.environ, "HF_HUB_DISABLE_UPDATE_CHECK": "1"}
        seen = self.log.stat().st_size if self.log.exists() else 0
        out = open(self.log, "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            text = self.log.read_bytes()[seen:].decode(errors="replace")  # this start's lines only
            found = re.findall(r" at (http://127\.0\.0\.1:\d+) ", text)
            if found and self.proc.poll() is None:
                self.url = found[-1]
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited: {self.log.read_text()[-2000:]}")
            time.sleep(0.05)
        raise RuntimeError("serve printed no URL")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def git(store: Path, repo: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "--git-dir", str(store / "kernels" / f"{repo}.git"), *args], capture_output=True,
                          text=True)


def leftovers(store: Path) -> list[str]:
    found = [p for p in store.rglob("*") if p.is_file() and (p.name.endswith(".lock") or p.name.startswith(
        "tmp_obj_")) and p.name != ".kernel-hub-serve.lock"]
    return sorted(str(p.relative_to(store)) for p in found)


def load(server: Server, threads: int, requests: int, writers: int) -> dict[str, Any]:
    from huggingface_hub import CommitOperationAdd, HfApi

    api = HfApi(endpoint=server.url, token=TOKEN)
    api.create_repo(REPO, repo_type="kernel", exist_ok=True)
    first = api.create_commit(REPO, [CommitOperationAdd("data/seed.bin", os.urandom(256 << 10))],
                              commit_message="seed", repo_type="kernel")
    acknowledged: list[str] = []
    errors: list[str] = []
    lock = threading.Lock()
    assert server.proc is not None
    rss_before = rss_kib(server.proc.pid)

    def work(index: int) -> None:
        mine = HfApi(endpoint=server.url, token=TOKEN)
        for n in range(requests):
            try:
                if index < writers:
                    info = mine.create_commit(REPO, [CommitOperationAdd(f"w{index}/{n}.txt", f"{index}-{n}".encode())],
                                              commit_message=f"w{index} {n}", repo_type="kernel")
                    with lock:
                        acknowledged.append(info.oid)
                elif n % 3 == 0:
                    mine.list_repo_refs(REPO, repo_type="kernel")
                elif n % 3 == 1:
                    list(mine.list_repo_tree(REPO, repo_type="kernel", revision=first.oid, recursive=True))
                else:
                    mine.hf_hub_download(REPO, "data/seed.bin", repo_type="kernel", revision=first.oid,
                                         cache_dir=str(server.store.parent / f"cache{index}"), force_download=True)
            except Exception as exc:  # counted, not fatal: the figures say how many
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}"[:200])

    start = time.perf_counter()
    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    seconds = time.perf_counter() - start
    rss_after = rss_kib(server.proc.pid)
    history = set(git(server.store, REPO, "rev-list", "main").stdout.split())
    # HTTP requests per operation: a commit is preupload + commit, a download HEAD + GET (256 KiB), refs and a
    # (one-page) tree listing one each
    reads = [n % 3 for _ in range(threads - writers) for n in range(requests)]
    http = 2 * writers * requests + sum(2 if r == 2 else 1 for r in reads)
    return {"threads": threads, "operations": threads * requests, "http_requests": http, "writers": writers,
            "seconds": round(seconds, 2), "ops_per_s": round(threads * requests / seconds, 1),
            "http_req_per_s": round(http / seconds, 1), "rss_before_mib": round(rss_before / 1024, 1),
            "rss_after_mib": round(rss_after / 1024, 1), "commits_acknowledged": len(acknowledged),
            "commits_lost": len([c for c in acknowledged if c not in history]), "errors": len(errors),
            "first_errors": errors[:3]}


def kill_mid_commit(server: Server) -> dict[str, Any]:
    from huggingface_hub import CommitOperationAdd, HfApi

    api = HfApi(endpoint=server.url, token=TOKEN)
    head_before = git(server.store, REPO, "rev-parse", "main").stdout.strip()
    big = os.urandom(48 << 20)
    outcome: dict[str, Any] = {}

    def send() -> None:
        try:
            outcome["oid"] = api.create_commit(REPO, [CommitOperationAdd("big.bin", big)], commit_message="big",
                                               repo_type="kernel").oid
        except Exception as exc:
            outcome["error"] = type(exc).__name__

    sender = threading.Thread(target=send)
    sender.start()
    objects = server.store / "kernels" / f"{REPO}.git" / "objects"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and sender.is_alive():  # kill once the server writes the big object
        if any(objects.glob("*/tmp_obj_*")) or any(objects.glob("*/*.lock")):
            break
        time.sleep(0.001)
    server.kill()
    sender.join()
    left = leftovers(server.store)
    # a killed dulwich writer leaves `.lock` files; plant the ones an older server left too, to see them cleared
    (objects.parent / "refs" / "heads" / "main.lock").write_text("0" * 40 + "\n")
    planted = left + ["refs/heads/main.lock (planted)"]
    server.start()
    cleared = not leftovers(server.store)
    head_after = git(server.store, REPO, "rev-parse", "main").stdout.strip()
    fsck = git(server.store, REPO, "fsck", "--full")
    again = HfApi(endpoint=server.url, token=TOKEN).create_commit(
        REPO, [CommitOperationAdd("big.bin", big)], commit_message="big again", repo_type="kernel").oid
    return {"client_saw": outcome.get("oid", outcome.get("error")), "left_by_kill": planted,
            "cleared_at_restart": cleared, "main_whole": head_after in (head_before, outcome.get("oid")),
            "fsck_ok": fsck.returncode == 0 and "bad sha1" not in fsck.stdout + fsck.stderr,
            "same_content_commits_after_restart": bool(again)}


def kill_mid_publish(server: Server, work: Path) -> dict[str, Any]:
    from kernel_hub.decide.versions import resolve
    from kernel_hub.errors import KernelHubError
    from kernel_hub.publish.release import publish
    from kernel_hub.scaffold import init
    from kernel_hub.sources.hub.source import HubSource

    folder = init("bench_toy", work / "src", repo_id=KERNEL_REPO)
    meta = folder / "kernel.yaml"
    meta.write_text(re.sub(r"(?m)^version: .*$", "version: 1.0.0", meta.read_text()))

    def run() -> Any:
        return publish(folder, repo_id=KERNEL_REPO, endpoint=server.url, token=TOKEN, skip_validation=True,
                       skip_tpu_compile=True, log=lambda _: None)

    run()
    meta.write_text(meta.read_text().replace("version: 1.0.0", "version: 1.1.0"))
    tag = server.store / "kernels" / f"{KERNEL_REPO}.git" / "refs" / "tags" / "v1.1.0"
    killed = threading.Event()

    def killer() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not tag.exists():
            time.sleep(0.0005)
        server.kill()
        killed.set()

    watcher = threading.Thread(target=killer)
    watcher.start()
    try:
        run()
        publish_outcome = "finished before the kill"
    except KernelHubError as exc:
        publish_outcome = f"failed: {str(exc)[:120]}"
    watcher.join()
    server.start()
    hub = HubSource(endpoint=server.url, token=False, cache_dir=work / "cache", offline=False)
    refs = hub.refs(KERNEL_REPO)
    try:
        v1_after_kill = resolve(refs, version=1).version
        v1_after_kill = str(v1_after_kill) if v1_after_kill else "?"
    except KernelHubError as exc:
        v1_after_kill = f"missing: {exc}"
    rerun = run()
    refs = HubSource(endpoint=server.url, token=False, cache_dir=work / "cache2", offline=False).refs(KERNEL_REPO)
    return {"publish": publish_outcome, "v1_after_restart": v1_after_kill, "rerun": rerun.summary(),
            "v1_after_rerun": str(resolve(refs, version=1).version)}


def second_server(server: Server) -> dict[str, Any]:
    from huggingface_hub import CommitOperationAdd, HfApi

    cmd = [sys.executable, "-m", "kernel_hub.cli", "serve", "--store", str(server.store), "--host", "127.0.0.1",
           "--port", "0", "--token", "another"]
    try:
        second = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                                env={**os.environ, "HF_HUB_DISABLE_UPDATE_CHECK": "1"})
        outcome = {"exit_code": second.returncode, "said": second.stderr.strip()[-200:]}
    except subprocess.TimeoutExpired:
        outcome = {"exit_code": None, "said": "still serving after 60 s (started read-write beside the first)"}
    info = HfApi(endpoint=server.url, token=TOKEN).create_commit(
        REPO, [CommitOperationAdd("after-second.txt", b"x")], commit_message="after", repo_type="kernel")
    return {**outcome, "first_still_commits": bool(info.oid)}


def racing_publishes(server: Server, work: Path, rounds: int) -> dict[str, Any]:
    from huggingface_hub import HfApi

    from kernel_hub.errors import KernelHubError
    from kernel_hub.publish.release import publish
    from kernel_hub.scaffold import init

    one_winner = agree = 0
    for r in range(rounds):
        repo = f"bench/race-{r}"
        folders = []
        for side in ("a", "b"):
            folder = init("bench_race", work / f"race{r}{side}", repo_id=repo)
            meta = folder / "kernel.yaml"
            meta.write_text(re.sub(r"(?m)^version: .*$", "version: 1.0.0", meta.read_text()))
            kernel = folder / "bench_race" / "kernel.py"
            kernel.write_text(kernel.read_text() + f"\n# content {side}\n")
            folders.append(folder)
        results: list[Any] = []
        refused: list[str] = []

        def run(folder: Path, repo: str = repo, results: list = results, refused: list = refused) -> None:
            try:
                results.append(publish(folder, repo_id=repo, endpoint=server.url, token=TOKEN, skip_validation=True,
                                       skip_tpu_compile=True, log=lambda _: None))
            except KernelHubError as exc:
                refused.append(str(exc))

        pool = [threading.Thread(target=run, args=(f,)) for f in folders]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        refs = HfApi(endpoint=server.url, token=TOKEN).list_repo_refs(repo, repo_type="kernel")
        tags = {t.name: t.target_commit for t in refs.tags}
        branches = {b.name: b.target_commit for b in refs.branches}
        one_winner += len(results) == 1 and len(refused) == 1
        agree += bool(results) and branches.get("main") == branches.get("v1") == tags.get("v1.0.0") == results[0].commit
    return {"rounds": rounds, "one_winner_one_refused": one_winner, "main_tag_v1_agree": agree}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kh-server-load-") as tmp:
        work = Path(tmp)
        server = Server(work / "store")
        server.start()
        try:
            figures = {"load": load(server, args.threads, args.requests, args.writers),
                       "sigkill_mid_commit": kill_mid_commit(server),
                       "sigkill_mid_publish": kill_mid_publish(server, work),
                       "second_serve": second_server(server),
                       "racing_publish": racing_publishes(server, work, args.rounds)}
            assert server.proc is not None
            figures["rss_end_mib"] = round(rss_kib(server.proc.pid) / 1024, 1)
        finally:
            server.stop()
    for section, values in figures.items():
        if isinstance(values, dict):
            for key, value in values.items():
                print(f"{section:20s} {key:36s} {value}")
        else:
            print(f"{section:20s} {values}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
