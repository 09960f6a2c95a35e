"""Reliability and security: kills, signals, faults, bad input, concurrent writers, safe loading."""
