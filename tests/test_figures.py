"""README.md's generated blocks (`python -m benchmarks.figures`) say what the reports git records say, and a changed
report makes `--check` fail. The reports are read as git records them (the index: the last commit plus what is
staged), not from the working tree, which `scripts/repro` rewrites (the profile's timings on every run)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import figures

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def reports(tmp_path: Path) -> Path:
    """A copy of the report files the blocks are made of, as git records them (as they are without git)."""
    folder = tmp_path / "reports"
    for name in figures.SOURCES:
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(["git", "show", f":reports/{name}"], cwd=REPO, capture_output=True, timeout=60)
        if proc.returncode == 0:
            target.write_bytes(proc.stdout)
        else:
            shutil.copyfile(REPO / "reports" / name, target)
    return folder


def test_the_readme_blocks_say_what_the_recorded_reports_say(reports, capsys):
    assert figures.main(["--check", "--reports", str(reports)]) == 0, capsys.readouterr().err
    readme = (REPO / "README.md").read_text()
    for name in figures.BLOCKS:
        assert f"<!-- {name}:start -->" in readme and f"<!-- {name}:end -->" in readme
    block = figures.figures_block(reports)
    assert 2 <= len(block) <= 6 and all(len(line) <= figures.WIDTH for line in block), block


def test_the_command_line_checks_too(reports):
    proc = subprocess.run([sys.executable, "-m", "benchmarks.figures", "--check", "--reports", str(reports)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_changed_metric_fails_the_check_and_a_rewrite_quotes_it(reports, tmp_path, capsys):
    path = reports / "evaluate" / "metrics.json"
    metrics = json.loads(path.read_text())
    metrics["classifier"]["accuracy"] = 0.5
    path.write_text(json.dumps(metrics))
    readme = tmp_path / "README.md"
    shutil.copyfile(REPO / "README.md", readme)

    assert figures.main(["--check", "--reports", str(reports), "--readme", str(readme)]) == 1
    assert "classifier accuracy 0.5000" in capsys.readouterr().err  # the diff shows the line that changes
    assert readme.read_text() == (REPO / "README.md").read_text()  # --check changes nothing

    assert figures.main(["--reports", str(reports), "--readme", str(readme)]) == 0
    assert "accuracy 0.5000" in readme.read_text()
    assert figures.main(["--check", "--reports", str(reports), "--readme", str(readme)]) == 0


def test_a_changed_profile_fails_the_check(reports, tmp_path):
    path = reports / "profile" / "measurements.json"
    profile = json.loads(path.read_text())
    profile["classifier"]["fp32"]["train_samples_per_s"] /= 2
    path.write_text(json.dumps(profile))
    assert figures.main(["--check", "--reports", str(reports)]) == 1


def test_a_readme_without_the_markers_is_an_error(reports, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# no blocks here\n")
    with pytest.raises(SystemExit, match="no block"):
        figures.main(["--reports", str(reports), "--readme", str(readme)])
