"""Publishing a kernel folder to a Hub repo: the release layout, tags and branches, identical-release detection."""
