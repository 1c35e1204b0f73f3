"""From a repo id to an imported module: the registry, planning, the trust check, lock files, kernel dependencies,
and the import itself (digests verified first)."""
