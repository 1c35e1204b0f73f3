"""transformers' own model tests run on kernelized models: the pytest plugins and run.py (none is collected)."""
