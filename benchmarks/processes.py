"""The repo's code in subprocesses, for benchmarks and tests alike: the venv's environment, stage commands, process
groups, and a real `mlflow server` that can be stopped (as a crash would) and started again on its port and store."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = REPO / ".venv" / "bin" if (REPO / ".venv" / "bin" / "python").exists() else Path(sys.executable).parent
PYTHON = str(BIN / "python")
# Every `mlflow server` started here: no job runner (a second process that imports MLflow, for GenAI jobs that
# neither the tests nor the benchmarks run).
NO_JOBS = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
STARTUP_TIMEOUT_S = 180


def run_env(**extra: str) -> dict[str, str]:
    """The environment of a stage or DVC subprocess: the venv first on PATH, one thread, no network, no debug."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MLFLOW_", "TRAINLAB_", "PREFECT_API")) and k not in ("PYTHONPATH",)}
    env.update({"PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}", "PYTHONPATH": str(REPO),
                "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "DVC_NO_ANALYTICS": "1", "PYTHONUNBUFFERED": "1",
                "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "1"})
    env.update(extra)
    return env


def stage_command(module: str, *args: str) -> list[str]:
    return [PYTHON, "-m", module, *args]


def stop_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        proc.wait(timeout=60)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def healthy(uri: str, path: str = "/health") -> bool:
    """Whether the server at `uri` answers 200 at `path` (MLflow's and Prefect's /health, a model server's /ping)."""
    try:
        with urllib.request.urlopen(f"{uri}{path}", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


class MlflowServer:
    """`mlflow server` on 127.0.0.1:`port`, SQLite backend and proxied artifacts under `root`."""

    def __init__(self, root: Path, port: int) -> None:
        self.root, self.port = root, port
        self.uri = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        log = self.root / f"server-{self.starts}.log"
        cmd = [str(BIN / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{self.root / 'server.db'}",
               "--artifacts-destination", str(self.root / "artifacts"), "--host", "127.0.0.1",
               "--port", str(self.port), "--workers", "1"]
        with open(log, "w") as out:
            self.proc = subprocess.Popen(cmd, cwd=self.root, env=run_env(**NO_JOBS), stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not healthy(self.uri):
            if self.proc.poll() is not None:
                raise AssertionError(f"mlflow server exited with {self.proc.returncode}:\n{log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"mlflow server not healthy after {STARTUP_TIMEOUT_S} s")
            time.sleep(0.3)

    def stop(self) -> None:
        """Kill the server's whole process group at once, as a crash or a pulled cable would."""
        if self.proc is not None:
            stop_group(self.proc, signal.SIGKILL)
            self.proc = None
        assert not healthy(self.uri)
