"""The torch CPU engine of the torch-facing builds (imports torch only, never jax): the grouped loop over
workers (grouped.py), packed expert weights (packed.py), the native rows kernel (native_rows.py), huge pages
(huge_pages.py)."""
