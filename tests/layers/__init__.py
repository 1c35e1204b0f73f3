"""Tests of kernelize."""
