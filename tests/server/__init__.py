"""Tests of kernel-hub serve."""
