"""The TPU compile gate: every TPU case of a kernel compiled by the real TPU compiler (libtpu, ahead of time, for
mock TPUs of chosen generations), cached, and required by publish for the TPU variants (publish/tpu_gate.py).

gate.py `compile_matrix` (the entry, and the conversions to the VerifiedPackage it takes), cache.py (results on
disk), worker_pool.py (the requests to the TPU worker, restarted after a crash), compile_worker.py (the worker's
compile mode, in the TPU environment). Shared with the cost model, one level up: chips, env, package, worker_client,
target, worker, worker_common. Nothing here imports the cost model.
"""
