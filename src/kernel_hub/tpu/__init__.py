"""TPU without a TPU: every kernel case compiled by the real TPU compiler (libtpu, ahead of time, for mock
TPUs of chosen generations), and a cost model read from the kernels' own schedules.

Two sides, each its own subpackage: compile_gate/ (entry `compile_matrix`, compile_gate/gate.py) and cost_model/
(entry `kernel_cost`, cost_model/schedule.py). What both use lives here once: chips.py (the generations and their
figures), env.py (where the TPU environment is), package.py (the verified package a worker imports), worker_client.py
(one worker subprocess per request), worker.py (that subprocess's entry, which hands each request mode to its
side), worker_common.py and target.py (inside the worker: the verified import, the refusal, the mock device).
Neither side imports the other, and nothing here imports either side but worker.py's mode table.

libtpu lives in its own environment (`kernel-hub setup-tpu`, or `make setup-tpu` in a checkout: .venv-tpu) and
runs in a subprocess (worker.py); this package stays light to import.
"""

from __future__ import annotations

from .chips import CHIPS, STEP_OVERHEAD_S, Chip, chip, parse_generations

__all__ = ["CHIPS", "STEP_OVERHEAD_S", "Chip", "chip", "parse_generations"]
