"""`mlflow models serve` on the registered champions (real servers on 127.0.0.1, real HTTP): raw inputs answered,
bad ones answered 400 with the message naming the row, and the server goes on serving."""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from benchmarks.processes import healthy
from tests.pipelines.conftest import free_port, stop_process_group
from tests.serving.raw_inputs import assert_same_as_command, raw_case, raw_values
from tests.serving.workspace import tracking_uri, trained_workspace

pytestmark = [pytest.mark.integration, pytest.mark.slow]
BIN = Path(sys.executable).parent
STARTUP_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """One `mlflow models serve -m models:/trainlab-<task>@champion --env-manager local` per task, started together
    from a folder outside the repo; {task: base URL}."""
    root = trained_workspace(tmp_path_factory)
    cwd = tmp_path_factory.mktemp("serve")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "TRAINLAB_")) and k != "PYTHONPATH"}
    env.update({"MLFLOW_TRACKING_URI": tracking_uri(root), "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "1",
                "OMP_NUM_THREADS": "1", "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}"})
    procs, urls, logs = {}, {}, {}
    try:
        for task in ("classifier", "segmenter", "text"):
            port = free_port()
            logs[task] = cwd / f"{task}.log"
            with open(logs[task], "w") as log:
                procs[task] = subprocess.Popen(
                    [str(BIN / "mlflow"), "models", "serve", "-m", f"models:/trainlab-{task}@champion",
                     "--env-manager", "local", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                    cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True)
            urls[task] = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        for task, url in urls.items():
            while not healthy(url, "/ping"):
                if procs[task].poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"mlflow models serve ({task}) not up:\n{logs[task].read_text()[-3000:]}")
                time.sleep(0.5)
        yield urls
    finally:
        for proc in procs.values():
            stop_process_group(proc, signal.SIGTERM)



def invoke(url: str, payload: dict) -> tuple[int, dict]:
    request = urllib.request.Request(f"{url}/invocations", data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def b64_png(pixels: np.ndarray) -> str:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def frame(column: str, *values) -> dict:
    return {"dataframe_split": {"columns": [column], "data": [[v] for v in values]}}


def test_text_server_answers_raw_texts_and_400_for_bad_rows(servers):
    url = servers["text"]
    status, body = invoke(url, frame("text", "I love this!", "what a sad day"))
    assert status == 200, body
    rows = body["predictions"]
    assert [sorted(r) for r in rows] == [["label", "prob_negative", "prob_neutral", "prob_positive"]] * 2
    assert sum(rows[0][f"prob_{c}"] for c in ("negative", "neutral", "positive")) == pytest.approx(1, abs=1e-5)
    status, body = invoke(url, frame("text", "fine", "   "))
    assert status == 400 and "1 of 2 rows rejected: row 1: empty text" in body["message"]
    status, body = invoke(url, {"dataframe_records": [{"review": "fine"}]})
    assert status == 400 and "missing inputs ['text']" in body["message"]
    status, body = invoke(url, {"dataframe_records": [{"text": "I love this!"}]})  # still serving
    assert status == 200 and body["predictions"][0]["label"] == rows[0]["label"]


def test_classifier_server_answers_base64_images_and_400_for_a_corrupt_one(servers):
    url = servers["classifier"]
    status, body = invoke(url, frame("image", b64_png(np.zeros((28, 28), np.uint8)),
                                     b64_png(np.full((56, 56, 3), 255, np.uint8))))
    assert status == 200, body
    assert [r["label"] in [str(d) for d in range(10)] for r in body["predictions"]] == [True, True]
    status, body = invoke(url, frame("image", b64_png(np.zeros((28, 28), np.uint8)),
                                     base64.b64encode(b"not an image").decode()))
    assert status == 400 and "1 of 2 rows rejected: row 1: unreadable or corrupt image" in body["message"]
    status, _ = invoke(url, frame("image", b64_png(np.zeros((28, 28), np.uint8))))
    assert status == 200


def test_segmenter_server_answers_a_mask_png_at_the_images_size(servers):
    status, body = invoke(servers["segmenter"], frame("image", b64_png(np.zeros((40, 50), np.uint8))))
    assert status == 200, body
    row = body["predictions"][0]
    mask = Image.open(io.BytesIO(base64.b64decode(row["mask_png"])))
    assert mask.size == (50, 40)
    assert sum(v for k, v in row.items() if k.startswith("fraction_")) == pytest.approx(1)


@pytest.mark.parametrize("task", ["classifier", "segmenter", "text"])
def test_the_servers_answer_what_the_predict_command_wrote_for_the_same_raw_files(servers, tmp_path_factory, task):
    """The input contract over HTTP (tests/serving/test_input_contract.py shows the rest of the chain): the raw files
    sent as base64 bytes, or the texts the command read from the BOM CSV and the TSVs, answered as the command."""
    from trainlab.serving.frames import input_column

    case = raw_case(tmp_path_factory)
    values = raw_values(case, task)
    if task != "text":
        values = [base64.b64encode(v).decode("ascii") for v in values]
    status, body = invoke(servers[task], frame(input_column(task), *values))
    assert status == 200, body
    records = body["predictions"]
    if task == "segmenter":
        records = [{**r, "mask_png": base64.b64decode(r["mask_png"])} for r in records]
    assert_same_as_command(case, task, records, "mlflow models serve")
