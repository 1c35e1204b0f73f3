"""Where a call will run: the platform that picks an implementation order and the interpret mode.

Not `jax.default_backend()` alone: compiling ahead of time for a mock TPU topology runs on a CPU host, where the
default backend is "cpu" while the arguments (or the default device, or the mesh) are TPU devices. Traced arguments
carry no device, so under jit the current mesh (jax.set_mesh) and the default device speak for them.
"""

from __future__ import annotations

from typing import Any

import jax


def _device_platform(device: Any) -> str | None:
    if isinstance(device, str):
        return device.split(":")[0].lower() or None
    return getattr(device, "platform", None)


def platform_of(*args: Any) -> str:
    """The platform of the arguments' devices, else of the current mesh, else of jax's default device, else
    jax.default_backend(). A TPU anywhere among the arguments wins (a call with a TPU operand runs there)."""
    found = []
    for leaf in jax.tree.leaves(args):
        if isinstance(leaf, jax.Array) and not isinstance(leaf, jax.core.Tracer):
            found += [d.platform for d in leaf.devices()]
    if found:
        return "tpu" if "tpu" in found else found[0]
    mesh = jax.sharding.get_abstract_mesh()  # readable under jit too (the concrete mesh is not)
    device = None if mesh.empty else getattr(mesh, "abstract_device", None)
    if getattr(device, "platform", None):
        return device.platform
    default = _device_platform(jax.config.jax_default_device)
    return default or jax.default_backend()
