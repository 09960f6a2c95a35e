"""Using the trained models: batch throughput through the predict command and the loaded MLflow pyfunc against the
same preprocessing plus forward called directly; one-row /invocations latency of a real `mlflow models serve`;
the time that logging the pyfunc adds to a training stage's exit."""

from __future__ import annotations

import base64
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import REPO, PartResult, alternate, fmt, log, table
from benchmarks.processes import free_port, healthy

TASKS = {"classifier": "classification", "segmenter": "segmentation", "text": "text"}
BATCH = 256  # inputs per forward in every contender (the pyfunc's own frame batch)
# The models of params.yaml (their speed is what matters here, not their accuracy: a couple of training steps)
SHORT = {"epochs": 1, "max_steps": 2, "warmup_epochs": 0.0}
# A process's first passes over thousands of inputs run several times slower (the allocator growing its heap: the
# text bag's first calls ran at 3,000 texts/s, later ones at 20,000): two warm-up calls each, then 5 timed repeats.
THROUGHPUT_REPEATS = 5


def run(quick: bool, repeats: int) -> PartResult:
    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="bench-predict-"))
    root = workspace(tmp)
    inputs = raw_inputs(root, 256 if quick else None)
    data: dict[str, Any] = {"workspace": str(root), "inputs": {k: len(v) for k, v in inputs.items()}}
    data["throughput"] = throughput(root, inputs, 1 if quick else max(repeats, THROUGHPUT_REPEATS))
    data["latency"] = latency(root, inputs, 30 if quick else 300)
    data["logging"] = logging_time(root, 1 if quick else repeats)
    headline = headline_figures(data)
    return PartResult("predict", data, markdown(data, headline), headline, time.perf_counter() - t0)


# --- the trained workspace ---------------------------------------------------------------------------------------

def env_for(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "TRAINLAB_"))}
    env.update({"PYTHONPATH": str(REPO), "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}",
                "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "1", "DVC_NO_ANALYTICS": "1",
                "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
                "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"})
    return env


def workspace(tmp: Path) -> Path:
    """params.yaml's models trained two steps on the embedded data, tracked to a private SQLite store, registered
    and promoted to champion (what `scripts/repro` leaves, in small)."""
    root = tmp / "ws"
    root.mkdir()
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["base"]["precision"] = "fp32"  # every contender in fp32 (the pyfunc's precision)
    for name in TASKS:
        params[name].update(SHORT)
    params["tracking"].update({"enabled": True, "uri": None})
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    steps = [["stages.prepare", "data/prepared", "reports/data_stats.json"]]
    steps += [[f"stages.train_{n}", f"data/prepared/{f}", f"models/{n}", f"reports/{n}"] for n, f in TASKS.items()]
    for step in steps:
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", *step], cwd=root, env=env_for(root), capture_output=True,
                              text=True, stdin=subprocess.DEVNULL, timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(f"{step[0]} exited {proc.returncode}: {proc.stderr[-1500:]}")
        log(f"predict: {step[0]} {time.perf_counter() - started:.1f} s")
    import mlflow

    from pipelines.compare import promote

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    for name in TASKS:
        promote(client, name)
    return root


def raw_inputs(root: Path, limit: int | None) -> dict[str, list[Any]]:
    """The test splits as raw inputs: PNG bytes of the stored images, the texts as prepare read them."""
    from safetensors.torch import load_file

    from trainlab.serving.masks import png_bytes

    out: dict[str, list[Any]] = {}
    for name in ("classifier", "segmenter"):
        images = load_file(str(root / "data/prepared" / TASKS[name] / "test.safetensors"))["images"][:limit]
        out[name] = [png_bytes(image.permute(1, 2, 0).numpy()) for image in images]
    lines = (root / "data/prepared/text/test.jsonl").read_text().splitlines()[:limit]
    out["text"] = [json.loads(line)["text"] for line in lines]
    return out


# --- batch throughput --------------------------------------------------------------------------------------------

def throughput(root: Path, inputs: dict[str, list[Any]], repeats: int) -> dict[str, Any]:
    import mlflow
    import pandas as pd
    import torch

    from trainlab.core.config import load_params
    from trainlab.jobs.predict import run_predict
    from trainlab.serving.frames import input_column
    from trainlab.serving.predictor import Predictor, cpu_runtime

    params = load_params(root / "params.yaml")
    results: dict[str, Any] = {}
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{root / 'mlflow.db'}"
    for name, items in inputs.items():
        predictor = Predictor.load(root / "models" / name, cpu_runtime())
        pyfunc = mlflow.pyfunc.load_model(f"models:/trainlab-{name}@champion")
        frame = pd.DataFrame({input_column(name): items})
        files = write_files(root / "bench_inputs" / name, name, items)

        def direct(r, warm, items=items, predictor=predictor):
            return rate(len(items), lambda: direct_forward(predictor, items))

        def command(r, warm, name=name, files=files):
            out = root / "bench_out" / name
            return rate(len(items), lambda: run_predict(str(root / "models" / name), files, out, params, BATCH,
                                                        progress=False))

        def loaded(r, warm, pyfunc=pyfunc, frame=frame):
            return rate(len(items), lambda: pyfunc.predict(frame))

        contenders = {"direct": direct, "predict_command": command, "pyfunc": loaded}
        with torch.inference_mode():
            for contender in contenders.values():  # the first of two warm-up calls (alternate makes the second)
                contender(-1, True)
            comparison = alternate(contenders, repeats, what=f"predict {name}")
        results[name] = {"median_inputs_per_s": {c: comparison.median(c, "inputs_per_s")
                                                 for c in ("direct", "predict_command", "pyfunc")},
                         "pyfunc_over_direct": comparison.ratio("pyfunc", "direct", "inputs_per_s"),
                         "command_over_direct": comparison.ratio("predict_command", "direct", "inputs_per_s"),
                         "detail": comparison.summary(["inputs_per_s"])}
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    return results


def write_files(folder: Path, name: str, items: list[Any]) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    if name == "text":
        import csv

        with open(folder / "texts.csv", "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["text"])
            writer.writerows([t] for t in items)
        return [str(folder / "texts.csv")]
    for i, item in enumerate(items):
        (folder / f"{i:06d}.png").write_bytes(item)
    return [str(folder)]


def direct_forward(predictor: Any, items: list[Any]) -> None:
    """The same preprocessing (the input contract, trainlab.data.inputs) and forward, called directly: no Predictor
    batching, DataFrame or files."""
    import numpy as np
    import torch

    from trainlab.tasks.augment import to_float_images

    model, contract = predictor.model, predictor.contract
    for start in range(0, len(items), BATCH):
        chunk = items[start:start + BATCH]
        x = torch.from_numpy(np.stack([contract(item, "input") for item in chunk]))
        if predictor.task != "text":
            x = to_float_images(x)
        logits = model(x).float()
        if predictor.task == "segmenter":
            logits.argmax(dim=1).to(torch.uint8).numpy()
        else:
            logits.softmax(dim=1).numpy()


def rate(count: int, fn) -> dict[str, float]:
    started = time.perf_counter()
    fn()
    seconds = time.perf_counter() - started
    return {"inputs_per_s": count / seconds, "seconds": seconds}


# --- one-row requests against the real server --------------------------------------------------------------------


def latency(root: Path, inputs: dict[str, list[Any]], requests: int) -> dict[str, Any]:
    """p50/p99 of one-row /invocations requests, one after another, to `mlflow models serve` on each champion."""
    results: dict[str, Any] = {}
    for name in ("text", "classifier", "segmenter"):
        port = free_port()
        proc = subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "models", "serve", "-m",
                                 f"models:/trainlab-{name}@champion", "--env-manager", "local", "--host", "127.0.0.1",
                                 "--port", str(port), "--workers", "1"], cwd=root, env=env_for(root),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            started = time.perf_counter()
            while not healthy(url, "/ping"):
                if proc.poll() is not None or time.perf_counter() - started > 180:
                    raise RuntimeError(f"mlflow models serve ({name}) did not start")
                time.sleep(0.25)
            startup = time.perf_counter() - started
            column = "text" if name == "text" else "image"
            values = [v if name == "text" else base64.b64encode(v).decode("ascii") for v in inputs[name]]
            bodies = [json.dumps({"dataframe_split": {"columns": [column], "data": [[values[i % len(values)]]]}})
                      .encode() for i in range(requests + 10)]
            for body in bodies[:10]:  # warm-up
                post(url, body)
            times = []
            for body in bodies[10:]:
                t = time.perf_counter()
                post(url, body)
                times.append((time.perf_counter() - t) * 1000)
            times.sort()
            results[name] = {"requests": len(times), "p50_ms": statistics.median(times),
                             "p99_ms": times[min(len(times) - 1, int(0.99 * len(times)))], "startup_s": startup}
            log(f"predict: {name} server p50 {results[name]['p50_ms']:.1f} ms, p99 {results[name]['p99_ms']:.1f} ms")
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
    return results


def post(url: str, body: bytes) -> None:
    request = urllib.request.Request(f"{url}/invocations", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        if response.status != 200:
            raise RuntimeError(f"/invocations answered {response.status}")
        response.read()


# --- what logging the pyfunc adds to a stage's exit ---------------------------------------------------------------

def logging_time(root: Path, repeats: int) -> dict[str, Any]:
    """tracker.log_model as the training stage calls it, tensor-level (before raw-input models) vs the pyfunc
    (which also saves the tensor-level model inside it), into one run of the workspace's store."""
    from safetensors.torch import load_file

    from trainlab.core.config import load_params
    from trainlab.serving.flavor import raw_example
    from trainlab.tasks import get
    from trainlab.tasks.saved import load_saved_model
    from trainlab.tracking.runs import start_run

    params = load_params(root / "params.yaml")
    params.tracking.register_models = False
    params.tracking.uri = f"sqlite:///{root / 'mlflow.db'}"
    results: dict[str, Any] = {}
    counter = iter(range(10_000))
    with start_run(params, stage="bench_log_model") as tracker:
        for name, folder in TASKS.items():
            data_dir, model_dir = root / "data/prepared" / folder, root / "models" / name
            model = load_saved_model(model_dir, name).model
            test = load_file(str(data_dir / "test.safetensors"))
            task = get(name).load().make_trainable(model, json.loads((data_dir / "meta.json").read_text()))
            example, _ = task.prepare_batch({k: v[:2] for k, v in test.items()}, False, None)
            raw = raw_example(name, test, data_dir)

            def tensor_level(r, warm, model=model, example=example, name=name):
                return timed(lambda: tracker.log_model(model, f"{name}-t{next(counter)}", example))

            def pyfunc(r, warm, model=model, example=example, name=name, raw=raw, model_dir=model_dir):
                return timed(lambda: tracker.log_model(model, f"{name}-p{next(counter)}", example,
                                                       model_dir=model_dir, raw_example=raw))

            comparison = alternate({"tensor_level": tensor_level, "pyfunc": pyfunc}, repeats,
                                   what=f"predict log_model {name}")
            tensor_s, pyfunc_s = comparison.median("tensor_level", "seconds"), comparison.median("pyfunc", "seconds")
            results[name] = {"tensor_level_s": tensor_s, "pyfunc_s": pyfunc_s, "extra_s": pyfunc_s - tensor_s}
    return results


def timed(fn) -> dict[str, float]:
    started = time.perf_counter()
    fn()
    return {"seconds": time.perf_counter() - started}


# --- report --------------------------------------------------------------------------------------------------------

def headline_figures(data: dict[str, Any]) -> dict[str, Any]:
    through, lat = data["throughput"], data["latency"]
    headline: dict[str, Any] = {}
    for name, r in through.items():
        headline[f"predict_{name}_pyfunc_over_direct"] = r["pyfunc_over_direct"]["median_of_paired_ratios"]
        headline[f"predict_{name}_command_over_direct"] = r["command_over_direct"]["median_of_paired_ratios"]
    headline["predict_pyfunc_over_direct_min"] = min(headline[f"predict_{n}_pyfunc_over_direct"] for n in through)
    headline["predict_text_request_p50_ms"] = lat["text"]["p50_ms"]
    headline["predict_image_request_p50_ms"] = lat["classifier"]["p50_ms"]
    headline["predict_pyfunc_log_extra_s"] = max(r["extra_s"] for r in data["logging"].values())
    return headline


def markdown(data: dict[str, Any], headline: dict[str, Any]) -> str:
    rows = []
    for name, r in data["throughput"].items():
        m = r["median_inputs_per_s"]
        rows.append([name, data["inputs"][name], f"{m['direct']:,.0f}", f"{m['predict_command']:,.0f}",
                     f"{m['pyfunc']:,.0f}", fmt(headline[f"predict_{name}_command_over_direct"], "x"),
                     fmt(headline[f"predict_{name}_pyfunc_over_direct"], "x")])
    lat = [[n, r["requests"], f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}", f"{r['startup_s']:.1f}"]
           for n, r in data["latency"].items()]
    logs = [[n, f"{r['tensor_level_s']:.2f}", f"{r['pyfunc_s']:.2f}", f"{r['extra_s']:+.2f}"]
            for n, r in data["logging"].items()]
    return "\n".join([
        "## predict", "",
        f"Batch throughput (inputs/s, fp32, batches of {BATCH}, the test splits as PNG bytes / texts; median of "
        "alternating repeats): the same preprocessing and forward called directly, the predict command (files in, "
        "CSV/masks out) and the loaded MLflow pyfunc (a DataFrame in and out).", "",
        table(["model", "inputs", "direct", "predict command", "pyfunc", "command / direct", "pyfunc / direct"],
              rows), "",
        "One-row `/invocations` requests, one after another, to `mlflow models serve --env-manager local` on the "
        "champion (ms):", "",
        table(["model", "requests", "p50", "p99", "server start (s)"], lat), "",
        "`log_model` as a training stage calls it (s, median): the tensor-level model alone (before raw-input models) "
        "and the pyfunc with the tensor-level model inside:", "",
        table(["model", "tensor-level", "pyfunc", "added"], logs), ""])
