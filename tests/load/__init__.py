"""Tests of loading, locks, the registry, trust."""
