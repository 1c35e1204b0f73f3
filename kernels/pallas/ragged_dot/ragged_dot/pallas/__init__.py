"""The Pallas TPU (Mosaic) kernel: gmm and tgmm (gmm.py), their group metadata (metadata.py) and tiles (config.py)."""
