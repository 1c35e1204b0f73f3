"""Tests of the validation harness and kernel contract."""
