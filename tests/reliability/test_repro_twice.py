"""`dvc repro --force` twice on the default data and the default params.yaml: every metrics file is byte-identical."""

from __future__ import annotations

import time

import pytest
import yaml

from tests.reliability.conftest import TIMINGS
from tests.reliability.factories import REPO, dvc, make_dvc_repo

pytestmark = [pytest.mark.reliability, pytest.mark.slow, pytest.mark.full_pipeline]

# Measurements, not results: their metrics are timings and are expected to differ run to run.
TIMING_STAGES = {"profile"}


def metrics_files(repo) -> list[str]:
    """Every `metrics:` output that dvc.yaml declares, stages that measure speed excepted."""
    stages = yaml.safe_load((repo / "dvc.yaml").read_text())["stages"]
    found = []
    for name, stage in stages.items():
        if name in TIMING_STAGES:
            continue
        for entry in stage.get("metrics") or []:
            found.append(next(iter(entry)) if isinstance(entry, dict) else entry)
    return sorted(found)


@pytest.mark.timeout(3 * 3600)  # the whole default pipeline twice: ~45 min on 2 busy cores
def test_dvc_repro_force_twice_on_the_default_data_gives_identical_metrics(tmp_path):
    repo = make_dvc_repo(tmp_path / "repo", yaml.safe_load((REPO / "params.yaml").read_text()))
    files = metrics_files(repo)
    assert len(files) >= 4, files
    runs = []
    for attempt in (1, 2):
        started = time.perf_counter()
        proc = dvc(["repro", "--force"], repo, timeout=5400)
        TIMINGS[f"dvc_repro_force_{attempt}"] = time.perf_counter() - started
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        runs.append({rel: (repo / rel).read_bytes() for rel in files})
    assert runs[0] == runs[1], [rel for rel in files if runs[0][rel] != runs[1][rel]]
