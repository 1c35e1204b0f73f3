"""Tests of what the CLI prints."""
