"""The kernel package format: kernel.yaml and the build layout, file digests and combined digests, vendored shared
code, symbol tables, signatures, release records and TPU compile records. Reads and checks bytes; never fetches."""
