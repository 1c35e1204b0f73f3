"""The TPU cost model: a kernel's time on a TPU generation read from its own schedule (schedule.py walks the
Pallas grid), without a TPU.

schedule.py `kernel_cost` and `explain` (the entries; schedule_grid.py and schedule_steps.py walk one pallas_call,
xla_ops.py prices the ops outside the kernels and decides what XLA removes, rates.py holds the per-generation
constants with their bands and the MXU pass rule), ici.py (an 8-chip slice's interconnect), tutorial_matmul.py (the
jax docs tutorial's measured matmul variants), workload.py (routing and ideal time of the rows), the worker modes
run in the TPU environment (worker.py's table: model_worker.py, model_quant.py, mesh_worker.py, peers_worker.py,
calibration_worker.py, decode_worker.py; the peers' kernels through tpu_inference_peers.py and stand_ins/), and their
parents in the main process (mesh.py, calibration.py, decode.py; the rest are driven by bench/). A whole decode step
of the seed models: decode_models.py (geometry, HBM floor), decode_step.py (the JAX step on the hub's kernels),
decode_worker.py (compiled and modeled), decode_vllm.py (vLLM's kernels swapped in), decode_gate.py (the release
check).

Checkout tooling, not part of the kernel-hub wheel: it builds on kernel_hub.tpu (chips, env, package, worker_client,
target, worker, worker_common) and nothing in kernel_hub imports it. Nothing here imports the compile gate.
"""
