"""Publishing a kernel folder to a Hub repo: the folder read once, the TPU compile gate, the release layout, tags and
branches, identical-release detection."""
