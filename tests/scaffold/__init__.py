"""Tests of kernel-hub init."""
