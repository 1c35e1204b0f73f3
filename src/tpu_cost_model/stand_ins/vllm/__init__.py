"""A stand-in for the one piece of vLLM that tpu-inference's kernels reach at import: `vllm.logger`.

tpu-inference 0.32.0 (vLLM's TPU kernels) imports `vllm.logger` from `tpu_inference/logger.py`, which every kernel
module imports for its logger; vLLM itself is not a dependency of the TPU environment (it pins its own torch and
jax). This folder goes on the path of the TPU-environment subprocess that walks those kernels only
(tpu_cost_model.tpu_inference_peers), never on the main environment's path, and holds nothing else.
"""
