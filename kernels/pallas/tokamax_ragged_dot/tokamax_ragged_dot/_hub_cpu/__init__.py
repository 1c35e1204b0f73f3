"""kernel-hub's CPU grouped matmul, shared with kernel-hub/ragged-dot-tpu.

cpu.py, config.py and metadata.py are symlinks to ragged_dot/ragged_dot/ in this repository, so the code
lives once; `kernel-hub publish` and the digests read through the links, so a published build holds
their content and loads where only jax and tokamax are installed.
"""
