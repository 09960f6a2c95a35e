"""Tests of the DVC stage modules."""
