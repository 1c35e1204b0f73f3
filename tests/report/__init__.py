"""Tests of kernel-hub report."""
