"""Tests of the data layer (trainlab.data)."""
