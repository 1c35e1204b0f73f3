"""kernel-hub's test suite. A regular package, not a namespace one: an installed distribution that ships a top-level
`tests` package (tpu-inference 0.32.0 does, in .venv-tpu) would otherwise shadow it for `from tests import ...`."""
