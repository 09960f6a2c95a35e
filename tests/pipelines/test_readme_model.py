"""The README's "Use the model" commands, taken from README.md and run as written in the tiny repo after its first
pipeline run (every stage once, as the first `scripts/repro`): the model folder and the registry's `champion` predict,
and `mlflow models serve` of the champion answers."""

from __future__ import annotations

import base64
import csv
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from benchmarks.processes import healthy
from tests.pipelines.conftest import BIN, REPO, free_port, stop_process_group

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

CLASSES = {"cat", "dog", "fox"}  # tests.data.factories.make_image_folder, the tiny repo's image folder
SENTIMENTS = {"bad", "good", "meh"}  # its texts.csv
LEFT_BY_THE_COMMANDS = ("path", "predictions", "reviews.csv")  # removed after: the tiny repo is shared
SERVER_STARTUP_S = 180


def readme_commands() -> dict[str, str]:
    """{predict on the folder, predict on the champion, serve the champion}: the README's commands that run a model."""
    from tests.test_docs import shell_commands

    commands = [c.text for c in shell_commands(REPO / "README.md")
                if c.text.startswith(("python -m trainlab.predict", "mlflow models serve"))]
    found = {"folder": [c for c in commands if " models/" in c],
             "champion": [c for c in commands if "trainlab.predict models:/" in c and "@champion" in c],
             "serve": [c for c in commands if c.startswith("mlflow models serve") and "@champion" in c]}
    assert all(len(found[key]) == 1 for key in found), f"README.md's model commands are not as expected: {commands}"
    return {key: found[key][0] for key in found}


def as_user_runs_it(command: str) -> list[str]:
    """argv of a README command: `python` and `mlflow` are the environment's, as after `source .venv/bin/activate`."""
    argv = shlex.split(command)
    return [sys.executable if argv[0] == "python" else str(BIN / argv[0]), *argv[1:]]


def user_env() -> dict[str, str]:
    """A shell in the repo root: no MLflow URI set (the repo's own mlflow.db is the default), one server worker."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MLFLOW_", "TRAINLAB_")) and k not in ("DVC_EXP_NAME", "DVC_STAGE")}
    return {**env, "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", "MLFLOW_MODELS_WORKERS": "1",
            "PYTHONPATH": str(REPO)}


def predictions(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture
def inputs(first_pipeline_run, tiny_repo):
    """The inputs the README's commands name, written in the tiny repo (its own images and texts); removed after."""
    digits = tiny_repo / "path" / "to" / "digits"
    digits.mkdir(parents=True)
    for image in sorted((tiny_repo / "data" / "raw" / "user" / "classes").glob("*/*_0.png")):
        shutil.copy(image, digits / image.name)
    (tiny_repo / "reviews.csv").write_text("review\n\"great lovely happy\"\n\"awful terrible sad\"\n")
    try:
        yield tiny_repo
    finally:
        for name in LEFT_BY_THE_COMMANDS:
            target = tiny_repo / name
            if target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink(missing_ok=True)


def test_model_commands_work_as_written_after_the_first_run(inputs):
    root, commands, env = inputs, readme_commands(), user_env()
    for key, out in (("folder", "predictions/digits"), ("champion", "predictions/reviews")):
        proc = subprocess.run(as_user_runs_it(commands[key]), cwd=root, env=env, capture_output=True, text=True,
                              timeout=300, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, f"{commands[key]}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    digits = predictions(root / "predictions" / "digits" / "predictions.csv")
    assert len(digits) == 3 and {row["label"] for row in digits} <= CLASSES, digits
    reviews = predictions(root / "predictions" / "reviews" / "predictions.csv")
    assert len(reviews) == 2 and {row["label"] for row in reviews} <= SENTIMENTS, reviews

    assert_the_served_champion_answers(root, commands["serve"], env)


def assert_the_served_champion_answers(root: Path, command: str, env: dict[str, str]) -> None:
    port = free_port()  # the README's port (5001) may be taken here: only the port differs from the README
    argv = [str(port) if arg == "5001" else arg for arg in as_user_runs_it(command)]
    assert str(port) in argv, command
    log = root / "predictions" / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_STARTUP_S
        while not healthy(url, "/ping"):
            assert proc.poll() is None and time.monotonic() < deadline, f"{command}: not up\n{log.read_text()[-3000:]}"
            time.sleep(0.5)
        image = next((root / "path" / "to" / "digits").iterdir())
        payload = {"dataframe_split": {"columns": ["image"], "data": [[base64.b64encode(image.read_bytes()).decode()]]}}
        request = urllib.request.Request(f"{url}/invocations", data=json.dumps(payload).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            assert response.status == 200
            assert json.loads(response.read())["predictions"][0]["label"] in CLASSES
    finally:
        stop_process_group(proc)

