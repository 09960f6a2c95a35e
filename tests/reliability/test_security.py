"""Security: safe loading only (safetensors, torch.load(weights_only=True), yaml safe loading), no shell, servers on
127.0.0.1, no secrets in the repo, and credentials from the environment never logged (masked where printed)."""

from __future__ import annotations

import ast
import json
import pickle
import re
import subprocess
from pathlib import Path

import pytest
import torch

from tests.reliability.conftest import SECRETS, URL_PASSWORD, make_workspace
from tests.reliability.factories import CHECKPOINT, CLASSIFIER_ARGS, REPO, tiny_params

pytestmark = pytest.mark.reliability

CODE_DIRS = ("trainlab", "stages", "pipelines", "scripts", "benchmarks", ".ci")


def repo_files() -> list[Path]:
    """The repo's files as they are now (tracked, and untracked but not ignored)."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO,
                            check=True, capture_output=True, text=True).stdout.split("\0")
    return [REPO / rel for rel in filter(None, listed) if (REPO / rel).is_file()]


def source_files() -> list[Path]:
    return [p for p in repo_files() if p.suffix == ".py" and p.relative_to(REPO).parts[0] in CODE_DIRS]


def calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node


def dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Name):
        return node.id
    return "?"


def keyword(call: ast.Call, name: str):
    return next((k.value for k in call.keywords if k.arg == name), None)


def parsed_sources():
    files = source_files()
    assert len(files) > 20 and any(p.name == "checkpoint.py" for p in files)
    for path in files:
        yield path.relative_to(REPO), ast.parse(path.read_text(), filename=str(path))


# --- static scans of the source ------------------------------------------------------------------------------------

def test_tensors_load_only_through_safetensors_or_torch_load_weights_only():
    bad = []
    for rel, tree in parsed_sources():
        for call in calls(tree):
            name = dotted(call.func)
            if name.endswith("torch.load"):
                flag = keyword(call, "weights_only")
                if not (isinstance(flag, ast.Constant) and flag.value is True):
                    bad.append(f"{rel}:{call.lineno}: {name} without weights_only=True")
            if name in ("pickle.load", "pickle.loads", "dill.load", "joblib.load", "cloudpickle.load", "marshal.load",
                        "torch.jit.load", "shelve.open"):
                bad.append(f"{rel}:{call.lineno}: {name}")
            if name.endswith(("np.load", "numpy.load")):
                flag = keyword(call, "allow_pickle")
                if flag is not None and not (isinstance(flag, ast.Constant) and flag.value is False):
                    bad.append(f"{rel}:{call.lineno}: {name} with allow_pickle")
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
                if any(n and n.split(".")[0] in ("pickle", "dill", "cloudpickle", "joblib", "shelve") for n in names):
                    bad.append(f"{rel}:{node.lineno}: imports {names}")
                if isinstance(node, ast.ImportFrom) and node.module == "torch" and "load" in names:
                    bad.append(f"{rel}:{node.lineno}: `from torch import load` hides torch.load from this check")
    assert bad == []


def test_yaml_is_only_loaded_safely():
    bad = []
    for rel, tree in parsed_sources():
        for call in calls(tree):
            name = dotted(call.func)
            if name in ("yaml.unsafe_load", "yaml.full_load", "yaml.unsafe_load_all", "yaml.full_load_all"):
                bad.append(f"{rel}:{call.lineno}: {name}")
            if name in ("yaml.load", "yaml.load_all", "yaml.compose", "yaml.parse", "yaml.scan"):
                loader = keyword(call, "Loader") or (call.args[1] if len(call.args) > 1 else None)
                if loader is None or dotted(loader) not in ("yaml.SafeLoader", "yaml.CSafeLoader", "SafeLoader"):
                    bad.append(f"{rel}:{call.lineno}: {name} without SafeLoader")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("Loader", "UnsafeLoader", "FullLoader", "CLoader") \
                    and dotted(node.value) == "yaml":
                bad.append(f"{rel}:{node.lineno}: yaml.{node.attr}")
    assert bad == []


def test_no_shell_and_commands_are_argument_lists():
    """No `shell=True`, no os.system/os.popen; every subprocess call gets a list, so params and data can never be
    parsed by a shell."""
    bad = []
    for rel, tree in parsed_sources():
        for call in calls(tree):
            name = dotted(call.func)
            shell = keyword(call, "shell")
            if shell is not None and not (isinstance(shell, ast.Constant) and shell.value is False):
                bad.append(f"{rel}:{call.lineno}: {name}(shell=...)")
            if name in ("os.system", "os.popen", "subprocess.getoutput", "subprocess.getstatusoutput", "os.execl",
                        "os.execlp", "os.spawnl"):
                bad.append(f"{rel}:{call.lineno}: {name}")
            if name.startswith("subprocess.") and call.args and isinstance(call.args[0], (ast.Constant, ast.JoinedStr)):
                bad.append(f"{rel}:{call.lineno}: {name} with a command string")
    assert bad == []
    shell_scripts = [p for p in repo_files() if p.relative_to(REPO).parts[0] in ("scripts", ".ci")]
    for script in shell_scripts:
        assert not re.search(r"\beval\b", script.read_text()), f"{script}: eval in a shell script"


SERVER_COMMAND = re.compile(r"mlflow\s+(ui|server)\b|prefect\s+server\s+start|\buvicorn\b|http\.server|\.serve\(")
LOOPBACK = re.compile(r"127\.0\.0\.1|localhost")


def test_every_server_binds_to_127_0_0_1():
    """Servers the project starts or tells you to start (docs, scripts, code, its tests) bind to 127.0.0.1: a line
    that starts one names the loopback address, any --host on it is 127.0.0.1; nothing binds 0.0.0.0; torchrun's
    rendezvous defaults to 127.0.0.1. (Prefect's `flow.serve` talks to the API and opens no port by default.)"""
    from trainlab.core.config import DistributedParams

    bad = []
    for path in repo_files():
        rel = path.relative_to(REPO)
        if (path.suffix not in (".py", ".md", ".yaml", ".yml", ".toml", ".sh", "")
                or rel.parts[:2] == ("tests", "reliability")):
            continue
        if rel.parts[0] == "docs":  # the team-setup guide: servers other machines reach, "unless told otherwise"
            continue
        try:
            lines = path.read_text().splitlines()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(lines, start=1):
            if re.search(r"0\.0\.0\.0|host\s*=\s*[\"']::[\"']|--host[ =]::", line):
                bad.append(f"{rel}:{number}: binds all interfaces: {line.strip()}")
            if not SERVER_COMMAND.search(line) or ".serve(" in line:
                continue
            if "--host" in line and not re.search(r"--host[ =\"',]+(127\.0\.0\.1|localhost)", line):
                bad.append(f"{rel}:{number}: binds elsewhere: {line.strip()}")
            elif "--host" not in line and not LOOPBACK.search(line) and path.suffix != ".py":
                bad.append(f"{rel}:{number}: no --host 127.0.0.1: {line.strip()}")
        if path.suffix == ".py":  # in code, a server start is a command list: its --host value is the next item
            for match in re.finditer(r"[\"']--host[\"']\s*,\s*([^,\]\)]+)", "\n".join(lines)):
                if not LOOPBACK.search(match[1]):
                    bad.append(f"{rel}: --host {match[1].strip()}")
    assert bad == []
    assert DistributedParams().rdzv_endpoint.startswith("127.0.0.1:")


SECRET_PATTERNS = {
    "AWS access key id": r"\b(AKIA|ASIA)[0-9A-Z]{16}\b",
    "private key": r"-----BEGIN (RSA |EC |DSA |OPENSSH |PGP )?PRIVATE KEY",
    "GitHub token": r"\bgh[pousr]_[A-Za-z0-9]{36}\b",
    "Slack token": r"\bxox[abprs]-[A-Za-z0-9-]{10,}",
    "Google API key": r"\bAIza[0-9A-Za-z_-]{35}\b",
    "credentials in a URL": r"[a-z][a-z0-9+.-]*://[^/\s:@'\"{}]+:[^/\s@'\"{}*]+@[a-z0-9.-]+",
    "assigned secret": (r"(?i)\b(password|passwd|secret_access_key|api_key|auth_token)\b\s*[:=]\s*"
                        r"[\"'][^\"'\s{}$]{6,}[\"']"),
}


PLACEHOLDER = re.compile(r"(?i):(password|pass|pw|secret|token|x+|\*+|<[^>]*>)@|[\"']\*+[\"']|change[-_]?me|example")


def test_no_secrets_in_the_repo():
    """No credential-shaped strings in any file of the repo (tests excepted: they hold obviously fake ones), no
    credentials in the DVC config, no local stores or env files under version control."""
    bad = []
    for path in repo_files():
        rel = path.relative_to(REPO)
        if rel.parts[0] == "tests":
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for what, pattern in SECRET_PATTERNS.items():
            for match in re.finditer(pattern, text):
                if not PLACEHOLDER.search(match[0]):
                    bad.append(f"{rel}: {what}: {match[0][:40]}")
    names = {str(p.relative_to(REPO)) for p in repo_files()}
    bad += [f"{n}: should not be in the repo" for n in names
            if Path(n).name in (".env", "mlflow.db", ".netrc", "credentials") or n.endswith((".pem", ".key"))]
    dvc_config = (REPO / ".dvc" / "config").read_text() if (REPO / ".dvc" / "config").exists() else ""
    assert not re.search(r"(?i)(password|secret_access_key|access_key_id|token)\s*=", dvc_config)
    assert bad == []


# --- behaviour: pickles refused, secrets never logged --------------------------------------------------------------

class Payload:
    """Unpickling this runs `Path.touch(marker)`: proof that a loader executed code from a file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


def write_pickle_bomb(path: Path, marker: Path, as_state_dict: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"conv.weight": Payload(marker)} if as_state_dict else {"fingerprint": "x", "model": Payload(marker)}
    torch.save(payload, path)
    return path


def test_the_pickle_bomb_is_live(tmp_path):
    """The file the next tests feed the loaders does run code when loaded unsafely (so refusing it means something)."""
    marker = tmp_path / "pwned"
    path = write_pickle_bomb(tmp_path / "bomb.pt", marker)
    torch.load(path, weights_only=False)
    assert marker.exists()
    with open(path, "rb") as f:  # torch.save's zip holds a pickle naming pathlib.Path.touch
        assert b"touch" in f.read()
    assert pickle.dumps(Payload(marker)).count(b"touch") == 1


def test_pickle_checkpoints_and_weights_are_refused_without_running_them(tmp_path, prepared, monkeypatch, capsys):
    from stages.train_classifier import main
    from trainlab.core.cli import run_cli
    from trainlab.core.config import ClassifierParams
    from trainlab.core.errors import CheckpointError
    from trainlab.engine.checkpoint import load_checkpoint
    from trainlab.jobs.train import save_model
    from trainlab.models.classifier import build_classifier
    from trainlab.tasks.saved import load_saved_model

    marker = tmp_path / "pwned"
    # 1. the loader itself
    bomb = write_pickle_bomb(tmp_path / "bomb.pt", marker)
    with pytest.raises(CheckpointError, match=r"bomb\.pt: not a valid checkpoint \(UnpicklingError"):
        load_checkpoint(bomb)
    # 2. a training stage finding it as the checkpoint to resume from
    ws = make_workspace(tmp_path / "ws", prepared, tiny_params())
    write_pickle_bomb(ws / CHECKPOINT, marker)
    monkeypatch.chdir(ws)
    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, CLASSIFIER_ARGS)
    assert exit_info.value.code == CheckpointError.exit_code
    assert f"error: {CHECKPOINT}: not a valid checkpoint" in capsys.readouterr().err
    assert not (ws / "models").exists()
    # 3. pretrained weights for a torchvision backbone
    weights = write_pickle_bomb(tmp_path / "pretrained.pt", marker, as_state_dict=True)
    with pytest.raises(CheckpointError, match=r"pretrained\.pt: cannot read a state_dict"):
        build_classifier(ClassifierParams(arch="resnet18", pretrained=str(weights)), num_classes=10, in_channels=1)
    # 4. a saved model whose weights file is a pickle
    model_dir = tmp_path / "model"
    save_model(build_classifier(ClassifierParams(width=4), num_classes=10, in_channels=1), model_dir)
    write_pickle_bomb(model_dir / "model.safetensors", marker)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not a readable safetensors file"):
        load_saved_model(model_dir, "classifier")
    assert not marker.exists()


def test_secret_keys_and_url_passwords_are_masked_in_what_is_logged(tmp_path, monkeypatch):
    import mlflow

    from trainlab.core.config import Params
    from trainlab.tracking.runs import start_run

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    params = Params.model_validate({"tracking": {"uri": f"sqlite:///{tmp_path}/mlflow.db"}})
    with start_run(params, stage="test", tags={"remote": f"https://bob:{URL_PASSWORD}@example.com/repo.git"}) as t:
        t.log_params({"store": {"url": f"s3://key:{URL_PASSWORD}@bucket/x", "api_key": "abcdef123456",
                                "token_length": 7}, "db_password": "hunter2-do-not-log"})
        t.set_tags({"auth_token": "tok-do-not-log"})
        t.log_dict({"overrides": {"tracking.uri": f"http://u:{URL_PASSWORD}@h:5000"}}, "summary.json")
    run = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_run(t.run_id)
    assert run.data.params["store.url"] == "s3://key:***@bucket/x"
    assert run.data.params["store.api_key"] == run.data.params["db_password"] == "***"
    assert run.data.params["store.token_length"] == "7"  # not every key that mentions a token is a secret
    assert run.data.tags["auth_token"] == "***" and run.data.tags["remote"] == "https://bob:***@example.com/repo.git"
    summary = mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/summary.json")
    assert summary == {"overrides": {"tracking.uri": "http://u:***@h:5000"}}
    raw = (tmp_path / "mlflow.db").read_bytes() + b"".join(
        p.read_bytes() for p in (tmp_path / "mlartifacts").rglob("*") if p.is_file())
    for secret in (URL_PASSWORD, "abcdef123456", "hunter2-do-not-log", "tok-do-not-log"):
        assert secret.encode() not in raw


def test_credentials_in_the_environment_never_reach_mlflow_or_the_outputs(tracked_runs):
    """Four real training runs with AWS/MLflow/API secrets in their environment (and, for one, a password in the
    tracking URL): no secret in any param, tag, metric name or artifact (environment.json included), in the SQLite
    store or artifact files byte for byte, in the models or reports, or in what the stages printed."""
    import mlflow

    root, runs = tracked_runs
    secrets = [*SECRETS.values(), URL_PASSWORD]
    for code, output, _ in runs:
        assert code == 0, output[-3000:]
        assert not [s for s in secrets if s in output]
    client = mlflow.MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("trainlab")
    found = client.search_runs([experiment.experiment_id])
    assert len(found) == len(runs)
    for run in found:
        logged = json.dumps([run.data.params, run.data.tags, sorted(run.data.metrics)])
        assert not [s for s in secrets if s in logged]
        env_record = mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/environment.json")
        assert env_record["python"] and not [s for s in secrets if s in json.dumps(env_record)]
    stored = [root / "mlflow.db", *(p for d in ("mlartifacts", "models", "reports") for p in (root / d).rglob("*"))]
    files = [p for p in stored if p.is_file()]
    assert len(files) > 20
    leaks = [(str(p), s) for p in files for s in secrets if s.encode() in p.read_bytes()]
    assert leaks == []
