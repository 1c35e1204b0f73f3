"""TPU without a TPU: every kernel case compiled by the real TPU compiler (libtpu, ahead of time, for mock
TPUs of chosen generations), and a cost model read from the kernels' own schedules.

libtpu lives in its own environment (`make setup-tpu`: .venv-tpu) and runs in a subprocess (worker.py);
this package stays light to import. Entry points: `compile_matrix` (gate.py), `kernel_cost` (schedule.py).
"""

from __future__ import annotations

from .chips import CHIPS, STEP_OVERHEAD_S, Chip, chip, parse_generations

__all__ = ["CHIPS", "STEP_OVERHEAD_S", "Chip", "chip", "parse_generations"]
