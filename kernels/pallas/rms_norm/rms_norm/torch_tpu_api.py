"""Entry of the torch-tpu build of RMSNorm: torch_api.py's functions, with the JAX kernel as a TorchTPU op.

Loading this build registers `kernel_hub_rms_norm_v<version>::rms_norm` (with its backward op) through torch_tpu's
`jax_op`, once per process (`tpu_ops()` returns them). Tensors on a TPU run that op: the Pallas kernels compiled by
Mosaic. Tensors elsewhere run the path for their device and say so (a warning, and a note in `last_implementation()`).
"""

from . import torch_api
from ._vendor.torch_tpu_ops import torch_tpu_build
from .torch_api import *  # noqa: F403  (the same functions as every torch build)
from .torch_bridge import TPU_OPS

__all__ = [*torch_api.__all__, "tpu_ops"]

#: {entry: torch op (CustomOpDef)} of this version on TorchTPU, registered at most once per process.
tpu_ops = torch_tpu_build(TPU_OPS, torch_api.DISPATCHES)
