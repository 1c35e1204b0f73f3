"""Tests of Hub and kernel-builder sources, bounded answers."""
