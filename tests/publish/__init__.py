"""Tests of kernel-hub publish."""
