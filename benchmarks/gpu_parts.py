"""scripts/gpu-check's parts, each in its own process under its own deadline, each recorded the moment it ends.

    python -m benchmarks.gpu_check run OUT [--budget S] [--device cuda|cpu] [--quick] [--only a,b] [--serial]

A part is one process: a group of `pytest -m gpu` tests (by concern: a failed CUDA graph capture can leave the CUDA
context unusable for the rest of its process, so it costs only its own group), the default pipeline, or one
benchmark part. Each gets min(its cap, what is left of the budget less the table's reserve) seconds; past that its
process group gets SIGTERM, then SIGKILL. OUT/parts/<name>.json is written as soon as it ends: status ok, failed,
timeout or skipped (no time left), seconds, exit code and a message (the failed tests, the error, the log's end).

GPU_CHECK_FAIL=name[,name] injects a failure, to rehearse one: a benchmark part raises inside `python -m benchmarks`
(BENCH_INJECT_FAILURE), any other part's command is replaced by one that exits 1 with that message.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
INJECT = "GPU_CHECK_FAIL"
TABLE_RESERVE_S = 10  # kept back from the budget: rendering the table takes ~1 s
MIN_PART_S = 15  # a part that would get less is skipped (recorded as such) rather than started
KILL_GRACE_S = 3

# The GPU tests by concern (pytest -k over tests/test_gpu.py; tests/test_gpu_check.py checks that every test is in
# exactly one group). Captures apart from eager training, so one failed capture costs one group; compile needs a C
# compiler.
TEST_GROUPS = {
    "tests_graphs": "graphed",  # fit with the step captured
    "tests_sync": "synchronises or capturable",  # the host-sync check (eager and captured) and capturable optimizers
    "tests_compile": "compiled",
    "tests_engine": "not (graphed or synchronises or capturable or compiled)",
}


@dataclass
class Part:
    name: str
    cmd: list[str]
    cap_s: float  # the most this part may take on the GPU machine (see benchmarks/README.md for how it was set)
    bench: str | None = None  # the `python -m benchmarks` part it runs, if any (for BENCH_INJECT_FAILURE)
    junit: Path | None = None
    env: dict[str, str] = field(default_factory=dict)


def plan(out: Path, device: str, quick: bool, cap_scale: float = 1.0) -> list[Part]:
    """The parts in the order they run; the tests first (they say whether the figures after them can be trusted)."""
    py = sys.executable
    parts = []
    pytest_timeout = _has("pytest_timeout")
    for group, keywords in TEST_GROUPS.items():
        junit = out / "parts" / f"{group}.xml"
        cmd = [py, "-m", "pytest", "-m", "gpu", "tests/test_gpu.py", "-k", keywords, "-q", "-p", "no:cacheprovider",
               f"--junitxml={junit}", "-o", "junit_family=xunit1"]
        if pytest_timeout:
            cmd += ["--timeout", "45"]  # one hung test costs its group 45 s, not the whole run
        parts.append(Part(group, cmd, CAPS[group] * cap_scale, junit=junit))
    quick_args = ["--quick", "--repeats", "1"] if quick else ["--repeats", "3"]

    def bench(name: str, only: str) -> Part:
        return Part(name, [py, "-m", "benchmarks", "--only", only, "--device", device, *quick_args,
                           "--out", str(out / "bench" / only)], CAPS[name] * cap_scale,
                    bench="mfu" if only == "mfu" else "training_speed")

    # the headline figures first: a run short of time loses the least important ones
    parts += [bench("bench_classifier", "classifier"), bench("bench_mfu", "mfu"),
              Part("pipeline", [py, "-m", "benchmarks.gpu_check", "pipeline", str(out)], CAPS["pipeline"] * cap_scale),
              bench("bench_text", "text"), bench("bench_segmenter", "segmenter")]
    return parts


# Caps in seconds on the GPU machine, from the CPU rehearsal's times and the GPU's known step times (README).
CAPS = {"tests_graphs": 50, "tests_sync": 50, "tests_compile": 50, "tests_engine": 50, "bench_classifier": 50,
        "bench_mfu": 40, "pipeline": 120, "bench_text": 30, "bench_segmenter": 30}
CONCURRENT = tuple(TEST_GROUPS)  # correctness only: they may share the machine


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def run_parts(out: Path, parts: list[Part], budget_s: float, serial: bool = False) -> list[dict]:
    """Run `parts` within `budget_s` seconds from now; the tests of CONCURRENT together, the rest one at a time
    (timings need the machine to themselves). Returns each part's record (also in OUT/parts/<name>.json)."""
    (out / "parts").mkdir(parents=True, exist_ok=True)
    end = time.monotonic() + budget_s - TABLE_RESERVE_S
    injected = [x for x in os.environ.get(INJECT, "").split(",") if x]
    records = []
    together = [] if serial else [p for p in parts if p.name in CONCURRENT]
    if together:
        running = [(p, *_start(out, p, injected)) for p in together]
        deadline = time.monotonic() + min(max(p.cap_s for p in together), end - time.monotonic())
        for p, proc, t0 in running:
            records.append(_finish(out, p, proc, t0, deadline))
    for p in parts:
        if p in together:
            continue
        left = end - time.monotonic()
        if left < MIN_PART_S:
            records.append(_record(out, p, "skipped", None, 0.0, f"no time left ({max(left, 0):.0f} s of the budget)"))
            continue
        proc, t0 = _start(out, p, injected)
        records.append(_finish(out, p, proc, t0, time.monotonic() + min(p.cap_s, left)))
    return records


def _start(out: Path, p: Part, injected: list[str]) -> tuple[subprocess.Popen, float]:
    env = {**os.environ, **p.env}
    env.pop(INJECT, None)
    cmd = p.cmd
    if p.name in injected:
        if p.bench:
            env["BENCH_INJECT_FAILURE"] = p.bench
        else:
            cmd = [sys.executable, "-c", f"import sys; sys.exit('injected failure ({INJECT}={p.name})')"]
    print(f"gpu-check: {p.name}: start (cap {p.cap_s:.0f} s)", flush=True)
    log = open(out / "parts" / f"{p.name}.log", "w")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    log.close()
    return proc, time.monotonic()


def _finish(out: Path, p: Part, proc: subprocess.Popen, t0: float, deadline: float) -> dict:
    try:
        code = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        status = "ok" if code == 0 else "failed"
    except subprocess.TimeoutExpired:
        _stop(proc)
        code, status = proc.returncode, "timeout"
    seconds = time.monotonic() - t0
    message = _message(out, p, status, seconds)
    return _record(out, p, status, code, seconds, message)


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the part's process group (its stage subprocesses too), SIGKILL after a grace period."""
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _message(out: Path, p: Part, status: str, seconds: float) -> str:
    tests = junit_summary(p.junit) if p.junit else None
    tail = _tail(out / "parts" / f"{p.name}.log")
    if status == "timeout":
        last = tail.splitlines()[-1][:200] if tail else "no output"
        return f"stopped at its deadline after {seconds:.0f} s; " + (tests["line"] if tests else f"last: {last}")
    if tests:
        return tests["line"]
    if status == "failed":
        log = (out / "parts" / f"{p.name}.log")
        text = log.read_text(errors="replace") if log.exists() else ""
        errors = [line for line in text.splitlines() if re.search(r"FAILED|Error|injected", line)]
        return (errors[0] if errors else tail.splitlines()[-1] if tail else "no output")[:300]
    return ""


def junit_summary(path: Path) -> dict | None:
    """Counts and the failed tests' names (with the first line of why) from a pytest JUnit XML file."""
    if not path.exists():
        return None
    try:
        root = ElementTree.parse(path).getroot()
    except ElementTree.ParseError:
        return None
    counts = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    failed = []
    for case in root.iter("testcase"):
        outcome = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        counts["failed" if outcome == "failure" else outcome] += 1
        if outcome in ("failure", "error"):
            why = next(c for c in case if c.tag == outcome).get("message", "")
            failed.append(f"{case.get('name')}: {why.splitlines()[0][:160] if why else outcome}")
    line = ", ".join(f"{v} {k}" for k, v in counts.items() if v) or "no tests ran"
    if failed:
        line += "; " + "; ".join(failed[:4]) + (f"; and {len(failed) - 4} more" if len(failed) > 4 else "")
    return {**counts, "failed_tests": failed, "line": line}


def _tail(path: Path, lines: int = 6) -> str:
    return "\n".join(path.read_text(errors="replace").strip().splitlines()[-lines:]) if path.exists() else ""


def _record(out: Path, p: Part, status: str, code: int | None, seconds: float, message: str) -> dict:
    record = {"part": p.name, "status": status, "exit": code, "seconds": round(seconds, 1), "cap_s": p.cap_s,
              "message": message, "command": " ".join(p.cmd[1:])}
    if p.junit:
        record["tests"] = junit_summary(p.junit)
    path = out / "parts" / f"{p.name}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, path)
    print(f"gpu-check: {p.name}: {status} in {seconds:.0f} s" + (f" ({message[:200]})" if message else ""),
          flush=True)
    return record
