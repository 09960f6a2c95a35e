"""Fixtures for the data tests: a folder of valid tiny user data and a params file pointing at it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.data.factories import make_user_data, user_data_section, write_params


@pytest.fixture
def user_data(tmp_path) -> Path:
    """tmp_path/raw with an image folder, paired PNG folders and a CSV, all valid."""
    return make_user_data(tmp_path / "raw")


@pytest.fixture
def user_params(tmp_path, user_data) -> Path:
    return write_params(tmp_path / "params.yaml", user_data_section(user_data))
