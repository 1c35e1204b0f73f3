"""`kernel-hub serve-model`: transformers' own server on a kernelized model. End to end on loopback: a tiny random
Qwen3-MoE (fixed seed) saved to a temp folder is served twice, by `kernel-hub serve-model` (kernelized, experts
included) and by plain `transformers serve` (no kernel-hub), with the same continuous-batching settings; the `openai`
client asks both the same questions, greedy, non-streaming and streaming, and the answers must be the same text. The
kernelize report the model's process wrote must show every MoE experts block on the hub's ragged-dot kernel."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from kernel_hub.cli import main
from kernel_hub.cli.serve_model import CPU_CACHE_BOUNDS, CacheBounds, cache_bounds, kernel_mapping, runs_on_cpu
from kernel_hub.errors import KernelHubError
from tests.client_env import child_env

SRC = Path(__file__).resolve().parents[2] / "src"
KINDS = ("moe_experts", "attention", "rms_norm")
START_SECONDS = 240  # two servers starting side by side on a loaded 2-core machine
PROMPTS = ("w5 w9 w12", "w40 w7", "w100 w3 w3 w61 w8")
MAX_TOKENS = 4
#: continuous batching's KV cache, the same for both servers (kernel-hub's CPU defaults, spelled out for transformers)
CB_ARGS = ["--continuous-batching", "--cb-block-size", str(CPU_CACHE_BOUNDS.block_size), "--cb-num-blocks",
           str(CPU_CACHE_BOUNDS.num_blocks), "--cb-max-batch-tokens", str(CPU_CACHE_BOUNDS.max_batch_tokens)]


def test_cpu_cache_is_bounded_unless_set() -> None:
    assert cache_bounds(CacheBounds(), on_cpu=True) == CPU_CACHE_BOUNDS
    assert cache_bounds(CacheBounds(num_blocks=8), on_cpu=True) == CacheBounds(
        CPU_CACHE_BOUNDS.block_size, 8, CPU_CACHE_BOUNDS.max_batch_tokens)
    assert cache_bounds(CacheBounds(), on_cpu=False) == CacheBounds()  # an accelerator: transformers sizes it
    assert runs_on_cpu("cpu", "cuda") and runs_on_cpu("auto", None)
    assert not runs_on_cpu("auto", "cuda") and not runs_on_cpu("cuda:0", None)


def test_kernel_mapping_names_kinds_and_repos() -> None:
    assert kernel_mapping(["attention=none", "moe_experts=me/my-experts"], KINDS) == {
        "attention": None, "moe_experts": "me/my-experts"}
    for bad in ("attention", "experts=a/b", "attention=", "attention=../x"):
        with pytest.raises(KernelHubError, match="--kernel"):
            kernel_mapping([bad], KINDS)


def test_bad_arguments_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve-model", "m", "--kernel", "experts=a/b"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown layer kind 'experts'" in err and "moe_experts" in err, err
    assert main(["serve-model", "m", "--port", "70000"]) == 2
    assert "a port is 1..65535" in capsys.readouterr().err


def test_help_names_the_endpoints_and_the_cpu_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve-model", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "/v1/chat/completions" in out and "kh.kernelize" in out and "--cb-num-blocks 256" in out


def _save_tiny_moe(path: Path) -> None:
    """A random tiny Qwen3-MoE (seed 0) and a word-level tokenizer (w4..w127) with a plain chat template."""
    from transformers import GenerationConfig

    from tests.tiny_models import save_word_tokenizer, tiny_model

    model = tiny_model("qwen3_moe", seed=0)
    model.generation_config = GenerationConfig(do_sample=False, eos_token_id=2, pad_token_id=0)
    model.save_pretrained(path)
    save_word_tokenizer(path)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def _server(cmd: list[str], log: Path) -> Iterator[subprocess.Popen]:
    """A server process that is always stopped (SIGTERM, then SIGKILL) when the block ends."""
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, env=child_env(HF_HUB_OFFLINE="1", PYTHONPATH=str(SRC)), stdout=out,
                                stderr=subprocess.STDOUT, cwd=log.parent)
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_healthy(port: int, proc: subprocess.Popen, log: Path, deadline: float) -> None:
    """Poll GET /health until it answers, the process exits, or the deadline passes."""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the server exited ({proc.returncode}) before answering:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:  # loopback only
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"no answer on port {port} within {START_SECONDS}s:\n{log.read_text()[-3000:]}")


def _answers(port: int, model: str) -> dict[str, list[str]]:
    """Each prompt's greedy answer, asked with the `openai` client, once whole and once streamed."""
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120,
                           http_client=openai.DefaultHttpx2Client(trust_env=False))  # loopback, no proxy
    whole, streamed = [], []
    for prompt in PROMPTS:
        ask = dict(model=model, messages=[{"role": "user", "content": prompt}], max_tokens=MAX_TOKENS, temperature=0)
        answer = client.chat.completions.create(**ask)
        assert answer.choices[0].message.role == "assistant" and answer.usage.completion_tokens >= 1, answer
        whole.append(answer.choices[0].message.content)
        chunks = client.chat.completions.create(**ask, stream=True)
        streamed.append("".join(c.choices[0].delta.content or "" for c in chunks if c.choices))
    return {"whole": whole, "streamed": streamed}


@pytest.mark.slow
def test_kernelized_model_serves_the_same_greedy_text_as_transformers(tmp_path: Path) -> None:
    from transformers.utils.import_utils import is_serve_available

    if not is_serve_available():
        pytest.fail("transformers serve needs fastapi, uvicorn and openai (make installs them: constraints.txt)")
    model = tmp_path / "tiny-qwen3-moe"
    _save_tiny_moe(model)
    report = tmp_path / "kernelize.json"
    ours_port, plain_port = _free_port(), _free_port()
    common = ["--host", "127.0.0.1", "--device", "cpu", "--dtype", "float32", "--log-level", "warning", *CB_ARGS]
    ours = [sys.executable, "-m", "kernel_hub.cli", "serve-model", str(model), "--port", str(ours_port),
            "--report", str(report), *common]
    plain = [str(Path(sys.executable).parent / "transformers"), "serve", str(model), "--port", str(plain_port),
             *common]
    ours_log, plain_log = tmp_path / "ours.log", tmp_path / "plain.log"
    with ExitStack() as stack:
        ours_proc = stack.enter_context(_server(ours, ours_log))
        plain_proc = stack.enter_context(_server(plain, plain_log))
        deadline = time.monotonic() + START_SECONDS
        _wait_healthy(ours_port, ours_proc, ours_log, deadline)
        _wait_healthy(plain_port, plain_proc, plain_log, deadline)
        got, want = _answers(ours_port, str(model)), _answers(plain_port, str(model))

    assert got == want, (got, want)
    assert got["whole"] == got["streamed"] and all(got["whole"]), got

    rows = json.loads(report.read_text())
    experts = {r["layer"]: r for r in rows["replaced"] if r["kind"] == "moe_experts"}
    assert sorted(experts) == [f"model.layers.{i}.mlp.experts" for i in range(2)], rows["replaced"]
    assert all(r["repo_id"] == "kernel-hub/ragged-dot-tpu" and r["max_error"] is not None for r in experts.values())
    assert not [k for k in rows["kept"] if k["kind"] == "moe_experts"], rows["kept"]
    assert "moe_experts -> kernel-hub/ragged-dot-tpu" in ours_log.read_text()
