"""Tests of repository-wide rules: import graph, typed surface, loopback guard."""
