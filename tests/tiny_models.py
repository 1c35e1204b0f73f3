"""The tiny model builders live in kernel_hub.report.models (the report's family matrix runs them too)."""

from kernel_hub.report.models import (  # noqa: F401
    FAMILIES,
    GENERIC_FAMILIES,
    GENERIC_SHRINK,
    HAND_FAMILIES,
    diffusers_model,
    family_names,
    flux,
    generic_tiny_model,
    hand_family_names,
    hand_tiny_model,
    llama,
    tiny_config,
    tiny_model,
)
