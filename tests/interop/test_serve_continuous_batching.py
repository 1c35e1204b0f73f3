"""Serving on our flash-attention build through transformers' own entry points, as a user runs them: HF `kernels`
fetches the torch-cpu build from `kernel-hub serve` (loopback); `from_pretrained(..., attn_implementation=
"kernel-hub/flash-attention-tpu")` + `generate_batch` runs continuous batching on our `flash_attn_varlen_func` (and on
our `flash_attn_with_kvcache`, paged, where transformers' decode fast path is allowed) with transformers' own tokens;
then `transformers serve --continuous-batching` on the same saved tiny model answers an OpenAI chat completion on
127.0.0.1 with the hub offline (the build comes from the cache the first step filled)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.hub_interop import KERNELS
from tests.hub_server import hub_env
from tests.tiny_models import save_word_tokenizer

REPO = "kernel-hub/flash-attention-tpu"
#: published by the interop_hub fixture (tests/conftest.py)
INTEROP_KERNELS = {REPO: KERNELS / "flash_attention"}
SERVE_SECONDS = 240

SCRIPT = r"""
import json, sys, torch
import transformers
from transformers import AutoModelForCausalLM, GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig
import transformers.generation.continuous_batching.initialization as init
import transformers.modeling_flash_attention_utils as fa_utils
from kernel_hub.report import models

transformers.logging.set_verbosity_error()
path = MODEL_DIR
model = models.tiny_model("qwen3_moe")
model.generation_config = GenerationConfig(max_new_tokens=5, do_sample=False, eos_token_id=2, pad_token_id=0)
model.save_pretrained(path)

CALLS = {"varlen": 0, "kvcache": 0}
FILES = {}


def counted():
    for attr, name in (("_flash_varlen_fn", "varlen"), ("_flash_with_kvcache_fn", "kvcache")):
        fn = getattr(fa_utils, attr)
        if fn is not None and not getattr(fn, "counted", False):
            FILES[name] = getattr(fn, "__wrapped__", fn).__code__.co_filename

            def wrapper(*a, _fn=fn, _name=name, **kw):
                CALLS[_name] += 1
                return _fn(*a, **kw)

            wrapper.counted = True
            setattr(fa_utils, attr, wrapper)


g = torch.Generator().manual_seed(0)
prompts = [torch.randint(3, 100, (n,), generator=g).tolist() for n in (3, 9, 5, 14, 2, 7)]
gen = GenerationConfig(max_new_tokens=5, do_sample=False, eos_token_id=-1, pad_token_id=0)


def tokens(m, **extra):
    cfg = ContinuousBatchingConfig(page_size=4, num_blocks=64, max_batch_tokens=16, max_requests_per_batch=2, **extra)
    out = m.generate_batch(prompts, generation_config=gen, continuous_batching_config=cfg)
    return [out[k].generated_tokens for k in sorted(out, key=lambda r: int(r.rsplit("_", 1)[-1]))]


ref = tokens(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval())  # sdpa, no kernel-hub
ours = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=REPO).eval()
fa_utils.lazy_import_flash_attention(REPO)
counted()
res = {"impl": ours.config._attn_implementation, "equal": tokens(ours) == ref, "calls": dict(CALLS)}
init.ensure_decode_fast_path_is_available = lambda config, cb_config, user: None  # transformers' CUDA/XPU gate
res["paged_equal"] = tokens(ours, max_blocks_per_request=8) == ref
res["paged_calls"] = {k: CALLS[k] - res["calls"][k] for k in CALLS}
res["files"] = FILES
print(json.dumps(res))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict, timeout: float) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # loopback only
        return json.loads(resp.read())


def test_generate_batch_by_repo_id_and_transformers_serve_continuous_batching(interop_hub, tmp_path) -> None:
    pytest.importorskip("tokenizers")
    from transformers.utils.import_utils import is_serve_available

    model_dir = tmp_path / "tiny-qwen3-moe"
    save_word_tokenizer(model_dir)  # the script saves the model beside it
    res = interop_hub.run(SCRIPT, REPO=REPO, MODEL_DIR=str(model_dir))
    assert res["impl"] == REPO and res["equal"], res
    assert res["calls"]["varlen"] > 0 and res["calls"]["kvcache"] == 0, res  # CPU: transformers packs, no fast path
    assert res["paged_equal"] and res["paged_calls"]["kvcache"] > 0, res  # the paged decode on our kernel
    for name, file in res["files"].items():  # the functions of the build HF kernels fetched from the loopback hub
        assert Path(file).as_posix().endswith("/build/torch-cpu/flash_attention/flash_attn_api.py"), (name, file)

    if not is_serve_available():
        pytest.fail("transformers serve needs fastapi and openai (make installs them: constraints.txt)")
    port = _free_port()
    env = hub_env(interop_hub.server, interop_hub.root / "cache", HF_HUB_OFFLINE="1")
    cmd = [str(Path(sys.executable).parent / "transformers"), "serve", str(model_dir), "--continuous-batching",
           "--attn-implementation", REPO, "--host", "127.0.0.1", "--port", str(port), "--device", "cpu",
           "--dtype", "float32", "--cb-block-size", "16", "--cb-num-blocks", "32", "--log-level", "warning"]
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
        try:
            deadline = time.monotonic() + SERVE_SECONDS
            answer = None
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    answer = _post(f"http://127.0.0.1:{port}/v1/chat/completions",
                                   {"model": str(model_dir), "messages": [{"role": "user", "content": "w5 w9 w12"}],
                                    "max_tokens": 4, "temperature": 0}, timeout=60)
                    break
                except OSError:
                    time.sleep(1)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    text = log.read_text()
    assert answer is not None, text[-3000:]
    choice = answer["choices"][0]
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str), answer
    assert answer["usage"]["completion_tokens"] >= 1, answer
    assert "does not support block tables" not in text  # transformers found our flash_attn_with_kvcache
    # logged by transformers' flash wrapper (_flash_attention_forward) on its first call: the request ran on the
    # flash-attn functions of our build (the only ones the server loaded)
    assert "for flash-attn compatibility" in text, text[-3000:]
    assert os.path.isdir(interop_hub.root / "cache")
