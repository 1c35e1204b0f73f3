"""Tests of kernel folders, releases, vendoring, the wheel."""
