"""`verify --lock`: `dvc repro --force` in a temporary copy of this repo, every output's hash compared with the
committed dvc.lock: identical; differs as expected for another machine (the fingerprints say why); differs
unexpectedly; timing-only (the profile stage, which measures speed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from trainlab.verify import DIFFERS, IDENTICAL, CouldNotRerun
from trainlab.verify.compare import keyed_differences

TIMING_STAGES = ("profile",)  # outputs that hold timings: never the same bytes twice
MACHINE_KEYS = ("cpu_isa", "held_isa", "cpu_model", "threads", "gpu", "torch", "cuda", "cudnn")
SKIPPED = ("data/prepared/", "models/", "reports/", "checkpoints/", "mlartifacts/", ".dvc/cache/", ".dvc/tmp/")
GIT_IDENTITY = {"GIT_AUTHOR_NAME": "verify", "GIT_AUTHOR_EMAIL": "verify@localhost",
                "GIT_COMMITTER_NAME": "verify", "GIT_COMMITTER_EMAIL": "verify@localhost"}


def committed_lock(root: Path) -> dict[str, Any]:
    proc = subprocess.run(["git", "show", "HEAD:dvc.lock"], cwd=root, capture_output=True, text=True)
    if proc.returncode != 0:
        raise CouldNotRerun(f"{root}: no committed dvc.lock (git show HEAD:dvc.lock: {proc.stderr.strip()[:200]})")
    return yaml.safe_load(proc.stdout) or {}


def out_hashes(lock: dict[str, Any]) -> dict[tuple[str, str], str]:
    """(stage, out path) -> its md5 in a dvc.lock."""
    return {(stage, out["path"]): out.get("md5", "") for stage, entry in (lock.get("stages") or {}).items()
            for out in entry.get("outs", [])}


def copy_repo(root: Path, dst: Path) -> None:
    """The working tree's files (tracked, untracked but not ignored; no outputs, no dvc.lock) in a fresh git repo."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=root,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for rel in filter(None, listed):
        if rel == "dvc.lock" or rel.startswith(SKIPPED) or "__pycache__" in rel or not (root / rel).is_file():
            continue
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, dst / rel)
    params = yaml.safe_load((dst / "params.yaml").read_text()) or {}
    params.setdefault("tracking", {})["enabled"] = False  # no stage's params: the lock's params entries stay equal
    (dst / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = {**os.environ, **GIT_IDENTITY}
    for args in (["init", "--quiet"], ["add", "-A"], ["commit", "--quiet", "--no-verify", "-m", "verify --lock"]):
        subprocess.run(["git", *args], cwd=dst, check=True, capture_output=True, env=env)


def dir_manifest_md5(root: Path, dir_md5: str, name: str) -> str | None:
    """The md5 of `name` inside a DVC-cached folder whose hash is `dir_md5` (from the .dir manifest in root's cache);
    None where root's cache does not hold that manifest."""
    manifest = root / ".dvc" / "cache" / "files" / "md5" / dir_md5[:2] / dir_md5[2:]
    if not dir_md5.endswith(".dir") or not manifest.is_file():
        return None
    try:
        entries = json.loads(manifest.read_text())
    except (ValueError, UnicodeDecodeError):
        return None
    return next((e.get("md5") for e in entries if isinstance(e, dict) and e.get("relpath") == name), None)


def recorded_fingerprint(root: Path, task: str, dir_md5: str) -> dict[str, str] | None:
    """The fingerprint of the run that trained the committed models/<task>: its run.json, or its MLflow run."""
    from trainlab.verify.record import _mlflow_run_of_model, from_mlflow

    weights = dir_manifest_md5(root, dir_md5, "model.safetensors")
    record = root / "reports" / task / "run.json"
    if record.is_file():
        data = json.loads(record.read_text())
        if data.get("fingerprint") and weights in (None, data.get("model_md5")):
            return data["fingerprint"]
    run_id = _mlflow_run_of_model(weights, root) if weights else None
    if run_id is None:
        return None
    try:
        return from_mlflow(run_id, root, f"runs:/{run_id}").fingerprint
    except CouldNotRerun:
        return None


def verify_lock(root: Path, workspace: Path) -> int:
    committed = committed_lock(root)
    repo = workspace / "repo"
    copy_repo(root, repo)
    print(f"verify --lock: dvc repro --force in a copy of {root} ({repo}); this runs the whole pipeline", flush=True)
    # this interpreter's folder first: dvc.yaml's `python -m stages...` must run the environment verify runs in
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    dvc = shutil.which("dvc", path=path) or "dvc"
    env = {**os.environ, "PATH": path, "MLFLOW_TRACKING_URI": f"sqlite:///{repo}/mlflow.db", "DVC_NO_ANALYTICS": "1"}
    with open(workspace / "dvc-repro.log", "w") as log:
        code = subprocess.run([dvc, "repro", "--force"], cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL).returncode
    if code != 0:
        tail = "\n".join((workspace / "dvc-repro.log").read_text().strip().splitlines()[-8:])
        raise CouldNotRerun(f"dvc repro in {repo} exited {code}:\n{tail}")
    fresh = yaml.safe_load((repo / "dvc.lock").read_text()) or {}
    theirs, ours = out_hashes(committed), out_hashes(fresh)
    rows, machine = [], {}
    for stage, path in sorted(set(theirs) | set(ours), key=lambda k: list(fresh.get("stages", {})).index(k[0])
                              if k[0] in fresh.get("stages", {}) else 1 << 30):
        model = theirs.get((stage, f"models/{stage.removeprefix('train_')}"))  # the trained model's folder
        verdict = lock_verdict(root, repo, stage, path, theirs.get((stage, path)), ours.get((stage, path)), machine,
                               model)
        rows.append((stage, path, verdict))
        print(f"  {stage:<18} {path:<48} {verdict}")
    unexpected = sum(v.startswith("differs unexpectedly") for _, _, v in rows)
    differing = sum(v.startswith("differs") for _, _, v in rows)
    print(f"verify --lock: {len(rows)} outputs: {len(rows) - differing} identical or timing-only, "
          f"{differing - unexpected} differ as expected, {unexpected} differ unexpectedly")
    return DIFFERS if differing else IDENTICAL


def lock_verdict(root: Path, repo: Path, stage: str, path: str, theirs: str | None, ours: str | None,
                 machine: dict[str, list[str]], model_md5: str | None = None) -> str:
    """One output's verdict; `machine` collects the training stages' machine differences for the stages after.
    `model_md5`: the committed hash of a training stage's model folder, whose run's fingerprint explains every
    output of that stage (its weights, history and metrics alike)."""
    if theirs == ours:
        return "identical"
    if stage in TIMING_STAGES:
        return "timing-only (the profile measures speed)"
    if theirs is None or ours is None:
        return f"differs unexpectedly ({'not in the committed' if theirs is None else 'not in the fresh'} dvc.lock)"
    if stage.startswith("train_"):
        task = stage.removeprefix("train_")
        recorded = recorded_fingerprint(root, task, model_md5 or theirs)
        here_record = repo / "reports" / task / "run.json"
        here = json.loads(here_record.read_text()).get("fingerprint", {}) if here_record.is_file() else {}
        if recorded is None:
            return "differs unexpectedly? (no fingerprint recorded for the committed output: cannot say why)"
        differences = [line for _, line in keyed_differences(recorded, here)]
        machine_lines = [line for key, line in keyed_differences(recorded, here) if key in MACHINE_KEYS]
        if machine_lines:
            machine[stage] = machine_lines
            return "differs as expected for another machine: " + "; ".join(machine_lines)
        if differences:
            return "differs; the fingerprints differ: " + "; ".join(differences)
        return "differs unexpectedly (the same fingerprint)"
    if machine:
        return f"differs as expected (it reads the outputs of {', '.join(sorted(machine))})"
    return "differs unexpectedly"

