"""scripts/test's work units: the test files that share the tiny pipeline's run go to one xdist worker together."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import PIPELINE_RUN_FILES, work_unit

REPO = Path(__file__).resolve().parent.parent


def test_the_files_that_use_the_pipeline_run_are_one_work_unit_and_only_they():
    uses = re.compile(r"def \w+\([^)]*\bfirst_pipeline_run\b")
    using = sorted(path.relative_to(REPO).as_posix() for path in (REPO / "tests").rglob("test_*.py")
                   if uses.search(path.read_text()))
    assert using == sorted(PIPELINE_RUN_FILES)
    assert len({work_unit(f"{path}::test_a") for path in using}) == 1
    assert work_unit("tests/pipelines/test_units.py::test_a[x]") == "tests/pipelines/test_units.py"
    assert work_unit("tests/test_docs.py::test_a") not in {work_unit(f"{path}::test_a") for path in using}
