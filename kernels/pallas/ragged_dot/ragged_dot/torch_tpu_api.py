"""Entry of the torch-tpu build of the ragged dot: torch_api.py's functions, with the JAX kernels as TorchTPU ops.

Loading this build registers `kernel_hub_ragged_dot_<version, digest>::ragged_dot` and `::ragged_dot_quantized` (int8 /
float8_e4m3fn weights with rhs_scale), each with its backward op, via torch_tpu `jax_op`, once per process (a second
load of the same version reuses them; `tpu_ops()` returns them). Tensors on a TPU run those ops: the Pallas kernels
compiled by Mosaic, gradients through the registered backward ops; `moe_experts` runs its two grouped matmuls through
them. Tensors elsewhere run the path for their device (on CPU the torch-native one the
torch-cpu build runs) and say so: a warning, and a note in `last_implementation()`.
"""

from . import torch_api
from ._vendor.torch_tpu_ops import torch_tpu_build
from .torch_api import *  # noqa: F403  (the same functions as every torch build)
from .torch_bridge import TPU_OPS

__all__ = [*torch_api.__all__, "tpu_ops"]

#: {entry: torch op (CustomOpDef)} of this version on TorchTPU, registered at most once per process.
tpu_ops = torch_tpu_build(TPU_OPS, torch_api.DISPATCHES)
