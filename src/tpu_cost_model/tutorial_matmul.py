"""The two variants of the jax docs' Pallas TPU matmul tutorial whose times on v5e are calibration rows, rewritten
here to the tutorial's description (jax ships only the plain kernel, jax.experimental.pallas.ops.tpu.matmul):

  * a transposed right-hand side: the kernel contracts y's minor axis, the caller hands y in (n, k) layout, and
    the timed function transposes it twice (the caller's logical swap, then the kernel wrapper's swap back),
    which XLA folds away;
  * a fused activation applied to the accumulator on the last k step.

Both are the BlockSpec pipeline of the plain kernel: grid (m / bm, n / bn, k / bk), an f32 accumulator in VMEM.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import jax


def _kernel(x_ref: jax.Ref, y_ref: jax.Ref, z_ref: jax.Ref, acc_ref: jax.Ref, *, nsteps: int, transpose_rhs: bool,
            activation: Callable[[jax.Array], jax.Array]) -> None:
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    @pl.when(pl.program_id(2) == 0)
    def _zero() -> None:
        acc_ref[...] = jnp.zeros_like(acc_ref)

    contract = ((1,), (1,)) if transpose_rhs else ((1,), (0,))
    acc_ref[...] += jax.lax.dot_general(x_ref[...], y_ref[...], (contract, ((), ())),
                                        preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == nsteps - 1)
    def _store() -> None:
        z_ref[...] = activation(acc_ref[...]).astype(z_ref.dtype)


def matmul(x: jax.Array, y: jax.Array, *, bm: int, bk: int, bn: int, transpose_rhs: bool = False,
           activation: Callable[[jax.Array], jax.Array] = lambda a: a) -> jax.Array:
    """x [m, k] @ y [k, n]; with transpose_rhs the kernel reads y as [n, k] (the wrapper swaps it)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    if transpose_rhs:
        y = y.swapaxes(0, 1)
        y_spec = pl.BlockSpec((bn, bk), lambda i, j, k: (j, k))
        n = y.shape[0]
    else:
        y_spec = pl.BlockSpec((bk, bn), lambda i, j, k: (k, j))
        n = y.shape[1]
    m, kk = x.shape
    body = functools.partial(_kernel, nsteps=kk // bk, transpose_rhs=transpose_rhs, activation=activation)
    return pl.pallas_call(
        body,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=0, grid=(m // bm, n // bn, kk // bk),
            in_specs=[pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)), y_spec],
            out_specs=pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
            scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)]),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(x, y)


def timed(variant: str, bm: int, bk: int, bn: int) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """The function the tutorial times for a variant: "transpose_rhs" takes y as [n, k] and swaps it before the
    kernel wrapper swaps it back; "relu" fuses jax.nn.relu."""
    import jax

    if variant == "transpose_rhs":
        return jax.jit(lambda x, y: jax.jit(functools.partial(matmul, bm=bm, bk=bk, bn=bn, transpose_rhs=True))(
            x, y.swapaxes(0, 1)))
    if variant == "relu":
        return jax.jit(functools.partial(matmul, bm=bm, bk=bk, bn=bn, activation=jax.nn.relu))
    raise ValueError(f"unknown tutorial matmul variant {variant!r}; known: transpose_rhs, relu")
