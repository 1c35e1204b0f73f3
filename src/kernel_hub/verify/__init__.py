"""Checking a kernel on this machine: the kernel contract (its hooks), numbers against a reference, timing."""
