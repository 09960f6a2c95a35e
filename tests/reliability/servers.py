"""A real `mlflow server` that a test can stop (as a crash would) and start again on the same port and store."""

from __future__ import annotations

import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from tests.reliability.factories import BIN, NO_JOBS, run_env, stop_group

STARTUP_TIMEOUT_S = 180


def healthy(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=2) as response:
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
            self.proc = subprocess.Popen(cmd, cwd=self.root, env=run_env(**NO_JOBS), stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
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
