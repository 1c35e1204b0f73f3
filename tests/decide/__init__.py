"""Tests of pure decisions: variants, versions, names."""
