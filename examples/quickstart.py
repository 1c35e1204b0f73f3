"""kernel-hub in a few seconds: load the ragged dot, call it on inputs built here, check it against a NumPy loop,
and run a few of its validation cases on this device. Run from a checkout or with kernel-hub installed:

    python examples/quickstart.py

No network and no token: the kernel comes from the embedded registry (set KERNEL_HUB_SOURCE=hub, or pass
source="hub", to load the copy at HF_ENDPOINT instead). tests/docs/test_quickstart.py runs this file.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import kernel_hub as kh

QUICK_CASES = ("cpu_empty_groups_f32", "cpu_one_group_f32", "cpu_partial_f32")  # three small validation cases


def main() -> int:
    rd = kh.get_kernel("kernel-hub/ragged-dot-tpu", version=1)  # major branch v1; or version=">=1.0,<2"
    print(f"loaded {rd.__kernel_hub__.repo_id} {rd.__kernel_hub__.version} [{rd.__kernel_hub__.variant}] "
          f"from {rd.__kernel_hub_source__}")

    # A Mixture-of-Experts-shaped call: 48 routed rows over 4 experts (one empty), K=64 -> N=32.
    rng = np.random.default_rng(0)
    group_sizes = np.array([20, 0, 17, 11], np.int32)            # rows per expert, in order
    lhs = rng.standard_normal((int(group_sizes.sum()), 64), np.float32)
    rhs = rng.standard_normal((len(group_sizes), 64, 32), np.float32)
    out = np.asarray(rd.ragged_dot(jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(group_sizes)))

    expected, start = np.zeros(out.shape), 0                       # the same thing, one group at a time
    for g, size in enumerate(group_sizes):
        expected[start:start + size] = lhs[start:start + size].astype(np.float64) @ rhs[g]
        start += size
    error = float(np.abs(out - expected).max() / np.abs(expected).max())
    print(f"ragged_dot {lhs.shape} x {rhs.shape} -> {out.shape}: max relative error {error:.1e} vs NumPy")

    report = kh.validate(rd, names=QUICK_CASES)                  # all cases: kh.validate(rd) (a minute or two)
    print(report)
    # With transformers: model = kh.kernelize(model); print(kh.kernelize_report(model)); kh.restore(model)  (see README)
    return 0 if report.passed and len(report.cases) == len(QUICK_CASES) and error < 1e-5 else 1


if __name__ == "__main__":
    raise SystemExit(main())
