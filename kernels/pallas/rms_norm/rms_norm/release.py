"""This package's release version: kernel.yaml's `version` (tests/test_torch_tpu.py checks that they agree).

It names the torch ops the torch-tpu build registers (kernel_hub_rms_norm_v<X>_<Y>_<Z>::rms_norm), so two versions
loaded in one process register two ops. Bump it with kernel.yaml.
"""

VERSION = "1.1.0"
