"""TPU without a TPU: every kernel case compiled by the real TPU compiler (libtpu, ahead of time, for mock
TPUs of chosen generations).

compile_gate/ (entry `compile_matrix`, compile_gate/gate.py) is what `validate --tpu` and the publish gate run. What
it shares with the checkout's cost model (src/tpu_cost_model, not shipped in the wheel, built on this package) lives
here once: chips.py (the generations and their figures), env.py (where the TPU environment is), package.py (the
verified package a worker imports), worker_client.py (one worker subprocess per request), worker.py (that subprocess's
entry: a table from request mode to the function that serves it, and `serve`, which the cost model's worker reuses
with its own table), worker_common.py and target.py (inside the worker: the verified import, the refusal, the mock
device). Nothing here imports the cost model, and nothing here imports the compile gate but worker.py's table.

libtpu lives in its own environment (`kernel-hub setup-tpu`, or `make setup-tpu` in a checkout: .venv-tpu) and
runs in a subprocess (worker.py); this package stays light to import.
"""

from __future__ import annotations

from .chips import CHIPS, Chip, chip, parse_generations

__all__ = ["CHIPS", "Chip", "chip", "parse_generations"]
