"""Tests of the TPU environment, compile gate and cost model."""
