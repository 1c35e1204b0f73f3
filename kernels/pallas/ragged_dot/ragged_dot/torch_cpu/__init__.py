"""The torch CPU engine of the torch-facing builds (imports torch only, never jax): the grouped loop over
workers (grouped.py), packed expert weights (packed.py), the native rows kernel (native_rows.py), huge pages
(huge_pages.py), the ragged dot with quantized weights (quantized_ragged_dot.py; its formats in quant_format.py)
and its native kernel (native_quant.py); the native kernels' C is package data beside them (native_rows.c,
native_quant.c, native_loops.h)."""
