"""scripts/test's work units: the test files that share an expensive session fixture go to one xdist worker together."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import SHARED_FIXTURE_FILES, work_unit

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("fixture", sorted(SHARED_FIXTURE_FILES))
def test_the_files_that_use_a_shared_fixture_are_one_work_unit_and_only_they(fixture):
    uses = re.compile(rf"def \w+\([^)]*\b{fixture}\b")
    using = sorted(path.relative_to(REPO).as_posix() for path in (REPO / "tests").rglob("test_*.py")
                   if uses.search(path.read_text()))
    assert using == sorted(SHARED_FIXTURE_FILES[fixture])
    assert len({work_unit(f"{path}::test_a") for path in using}) == 1


def test_every_other_file_is_its_own_unit_and_the_shared_units_are_apart():
    assert work_unit("tests/pipelines/test_units.py::test_a[x]") == "tests/pipelines/test_units.py"
    units = {fixture: work_unit(f"{files[0]}::test_a") for fixture, files in SHARED_FIXTURE_FILES.items()}
    assert len(set(units.values())) == len(units)
    assert work_unit("tests/test_docs.py::test_a") not in units.values()
