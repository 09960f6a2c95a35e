"""Tests for trainlab.models."""
