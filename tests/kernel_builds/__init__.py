"""Tests of the ragged dot's builds as kernel-hub loads them."""
