"""`kernel-hub demo`: the ragged dot from the embedded registry, validated here, raced against
jax.lax.ragged_dot on a decode-shaped MoE call; then a small MoE model kernelized (when available).
No network, no token."""

from __future__ import annotations

import time

import numpy as np

REPO = "kernel-hub/ragged-dot-tpu"
# Qwen3-30B-A3B routing (128 experts, top-8) at decode batch 64; K and N scaled so that the dense
# jax.lax.ragged_dot baseline (G times the work on CPU) finishes in a fraction of a second.
EXPERTS, TOP_K, BATCH, HIDDEN, OUT = 128, 8, 64, 256, 512


def routed_group_sizes(rng: np.random.Generator, batch: int, experts: int, top_k: int) -> np.ndarray:
    """Group sizes from a real top-k routing: each token picks top_k distinct experts."""
    logits = rng.standard_normal((batch, experts))
    chosen = np.argsort(-logits, axis=1)[:, :top_k]
    return np.bincount(chosen.ravel(), minlength=experts).astype(np.int32)


def run_demo(quick: bool = False, print_fn=print) -> int:
    import jax
    import jax.numpy as jnp

    from kernel_hub import get_kernel, validate
    from kernel_hub.load.planning import plan_load
    from kernel_hub.verify.timing import RATIO_CONVENTION, Ratio, Spread, format_ratio, interleaved_samples
    from kernel_hub.verify.validation import quick_selection, relative_error

    t0 = time.perf_counter()
    plan = plan_load(REPO)
    print_fn(f"== load {REPO} from the embedded registry (no network)")
    print_fn(plan.describe())
    kernel = get_kernel(REPO)
    info = kernel.__kernel_hub__
    print_fn(f"loaded    {info.repo_id} {info.version} [{info.variant}] as module {kernel.__name__}")

    print_fn("\n== validate on this device" + (" (one case per mode and dtype)" if quick else ""))
    report = validate(kernel, select=quick_selection if quick else None)
    print_fn(str(report))
    if not report.passed:
        print_fn("validation FAILED: the kernel's numbers do not match its reference here")
        return 1

    print_fn(f"\n== decode MoE ragged dot: {EXPERTS} experts, top-{TOP_K}, batch {BATCH} "
             f"-> lhs[{BATCH * TOP_K},{HIDDEN}] x rhs[{EXPERTS},{HIDDEN},{OUT}]")
    rng = np.random.default_rng(0)
    group_sizes = jnp.asarray(routed_group_sizes(rng, BATCH, EXPERTS, TOP_K))
    lhs = jnp.asarray(rng.standard_normal((BATCH * TOP_K, HIDDEN)), jnp.float32)
    rhs = jnp.asarray(rng.standard_normal((EXPERTS, HIDDEN, OUT)) / np.sqrt(HIDDEN), jnp.float32)
    ours = jax.jit(lambda a, b, g: kernel.ragged_dot(a, b, g))
    lax = jax.jit(lambda a, b, g: jax.lax.ragged_dot(a, b, g))
    out_ours, out_lax = ours(lhs, rhs, group_sizes), lax(lhs, rhs, group_sizes)
    err = relative_error(np.asarray(out_ours, np.float64), np.asarray(out_lax, np.float64))
    agree = err <= 1e-4
    print_fn(f"agreement max relative error {err:.2e} (tolerance 1e-4): {'AGREE' if agree else 'DISAGREE'}")
    samples = interleaved_samples(
        {"kernel": lambda: ours(lhs, rhs, group_sizes), "lax": lambda: lax(lhs, rhs, group_sizes)},
        repeats=3 if quick else 7,
        settle=True,  # each timed warm: neither pays for the other's memory traffic
    )
    times = {k: Spread.of(v) for k, v in samples.items()}
    impl = kernel.last_implementation()[0] if hasattr(kernel, "last_implementation") else "auto"
    print_fn(f"{'path':<34}{'median ms':>10}  {'IQR ms':>15}   (interleaved, each call timed warm)")
    for label, key in ((f"kernel-hub ragged_dot ({impl})", "kernel"), ("jax.lax.ragged_dot", "lax")):
        t = times[key]
        print_fn(f"{label:<34}{t.median * 1e3:>10.2f}  {f'{t.q1 * 1e3:.2f}-{t.q3 * 1e3:.2f}':>15}")
    print_fn(f"kernel-hub vs jax.lax.ragged_dot: {format_ratio(Ratio.of(samples['lax'], samples['kernel']))}")
    print_fn(f"  ({RATIO_CONVENTION})")
    status = 0 if agree else 1

    try:
        from kernel_hub.demo import moe as demo_moe
    except ImportError:
        demo_moe = None
    if demo_moe is not None:
        print_fn("\n== kernelize a small Qwen3-MoE model")
        result = demo_moe.run(print_fn, quick=quick)
        status = status or int(not result.get("ok", True))
    print_fn(f"\ndemo finished in {time.perf_counter() - t0:.1f} s: {'OK' if status == 0 else 'FAILED'}")
    return status
