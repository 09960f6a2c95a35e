"""Tests for trainlab.core.cli: a user error is one message and its own exit code, with or without --debug."""

from __future__ import annotations

import pytest

from tests.reliability.factories import CLASSIFIER_ARGS, run_stage, tiny_params, tree, write_params
from trainlab.core.cli import DEBUG_ENV, command_parser, run_cli
from trainlab.core.errors import DataError, InputsRejected, ParamsError

ERRORS = [ParamsError("params.yaml: invalid params"), DataError("data/raw/texts.csv: row 3: empty text"),
          InputsRejected("1 of 2 inputs could not be predicted")]


def run(exc: Exception, argv: list[str], capsys) -> tuple[int, list[str], str]:
    """run_cli on a main that raises `exc`; returns (exit code, the argv main saw, stderr)."""
    seen = []

    def main(args):
        seen.extend(args)
        raise exc

    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, argv)
    return exit_info.value.code, seen, capsys.readouterr().err


@pytest.mark.parametrize("exc", ERRORS, ids=lambda e: type(e).__name__)
def test_without_debug_one_message_and_the_errors_own_exit_code(exc, capsys, monkeypatch):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    code, seen, err = run(exc, ["in", "out"], capsys)
    assert code == exc.exit_code and seen == ["in", "out"]
    assert err.splitlines() == [f"error: {exc}", f"(set {DEBUG_ENV}=1 or pass --debug for a traceback)"]


@pytest.mark.parametrize("how", ["--debug", f"{DEBUG_ENV}=1"])
@pytest.mark.parametrize("exc", ERRORS, ids=lambda e: type(e).__name__)
def test_debug_adds_the_traceback_and_keeps_the_exit_code(exc, how, capsys, monkeypatch):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    if how != "--debug":
        monkeypatch.setenv(DEBUG_ENV, "1")
    code, seen, err = run(exc, ["in", "--debug", "out"] if how == "--debug" else ["in", "out"], capsys)
    assert code == exc.exit_code and seen == ["in", "out"]
    assert err.startswith("Traceback (most recent call last)")
    assert f"trainlab.core.errors.{type(exc).__name__}: {exc}" in err
    assert err.splitlines()[-1] == f"error: {exc}"


def test_help_says_the_exit_code_stays():
    assert "exit code stays" in " ".join(command_parser("x").format_help().split())


def test_a_stage_run_with_debug_exits_2_for_bad_params(tmp_path):
    write_params(tmp_path / "params.yaml", tiny_params({"classifier": {"lrr": 0.1}}))
    proc = run_stage("stages.train_classifier", [*CLASSIFIER_ARGS, "--debug"], tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback (most recent call last)" in proc.stderr and "classifier.lrr" in proc.stderr
    assert tree(tmp_path) == ["params.yaml"]


EXIT_WORK = """
import atexit, sys, threading, time
from pathlib import Path
from trainlab.core.cli import run_cli
from concurrent.futures import ThreadPoolExecutor

out = Path(sys.argv[1])

def main(argv):
    def late():
        time.sleep(0.5)
        (out / "thread").write_text("done")
    threading.Thread(target=late).start()  # non-daemon: the exit waits for it
    ThreadPoolExecutor(1).submit(lambda: (time.sleep(0.3), (out / "pool").write_text("done")))
    atexit.register(lambda: (out / "atexit").write_text((out / "thread").read_text()))
    print("printed, not flushed", end="")

run_cli(main, [], teardown=False)
raise SystemExit("not reached: run_cli exits")
"""


def test_a_stage_exit_without_teardown_still_waits_for_threads_runs_atexit_and_flushes(tmp_path):
    """The DVC stages skip the interpreter's teardown after a success, not the work an exit does."""
    import subprocess
    import sys

    from tests.reliability.factories import REPO

    proc = subprocess.run([sys.executable, "-c", EXIT_WORK, str(tmp_path)], capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "printed, not flushed"
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {"thread": "done", "pool": "done", "atexit": "done"}
