"""A local `prefect server start` for commands that need a scheduler: reuse one on 127.0.0.1, or start one and stop
it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from trainlab.core.errors import UserError

HOST = "127.0.0.1"
STARTUP_TIMEOUT_S = 300.0  # the first start creates and migrates the server's SQLite DB: slow on a busy 2-core CPU
STOP_TIMEOUT_S = 30.0


class NoPrefectServer(UserError):
    """No Prefect API is configured and a local server could not be started."""


def configured_api_url() -> str | None:
    """PREFECT_API_URL from the environment or the active Prefect profile, or None (an ephemeral API)."""
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    return str(url) if url else None


def healthy(api_url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=timeout_s) as response:
            return response.status == 200
    except OSError:
        return False


def port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex((HOST, port)) == 0


def default_port() -> int:
    """The port `prefect server start` uses by default (PREFECT_SERVER_API_PORT, else 4200)."""
    from prefect.settings import get_current_settings

    return int(get_current_settings().server.api.port)


@contextlib.contextmanager
def local_server(port: int | None = None, log: Callable[[str], None] = print) -> Iterator[str]:
    """The API URL of a Prefect server on 127.0.0.1:`port`: one already running there is reused (and left running);
    otherwise `prefect server start` is started for the duration of the block and stopped after it. Sets
    PREFECT_API_URL for this process and its children meanwhile. NoPrefectServer when neither works."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    port = port or default_port()
    api_url = f"http://{HOST}:{port}/api"
    with contextlib.ExitStack() as stack:
        if healthy(api_url):
            log(f"using the Prefect server already running at http://{HOST}:{port} (its UI shows the runs)")
        elif port_in_use(port):
            raise NoPrefectServer(f"port {port} on {HOST} is taken by something that is not a Prefect server; free "
                                  "it, set PREFECT_SERVER_API_PORT to another port, or start a server with "
                                  "`prefect server start` and set PREFECT_API_URL to its /api URL")
        else:
            stack.enter_context(started_server(port, log))
        saved = os.environ.get("PREFECT_API_URL")
        os.environ["PREFECT_API_URL"] = api_url
        stack.callback(_restore_env, "PREFECT_API_URL", saved)
        stack.enter_context(temporary_settings(updates={PREFECT_API_URL: api_url}))
        yield api_url


@contextlib.contextmanager
def started_server(port: int, log: Callable[[str], None]) -> Iterator[subprocess.Popen]:
    """`prefect server start --host 127.0.0.1 --port PORT` in its own process group until the block ends."""
    api_url = f"http://{HOST}:{port}/api"
    logfile = Path(tempfile.mkstemp(prefix="prefect-server-", suffix=".log")[1])
    prefect = Path(sys.executable).with_name("prefect")
    command = [str(prefect) if prefect.exists() else "prefect", "server", "start", "--host", "127.0.0.1",
               "--port", str(port)]
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    log(f"starting a local Prefect server (`{' '.join(command[-6:])}`, log {logfile}); it stops when this does")
    with open(logfile, "w") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not healthy(api_url):
            if proc.poll() is not None:
                raise NoPrefectServer(f"`prefect server start` exited with {proc.returncode} (see {logfile}); start "
                                      "one yourself and set PREFECT_API_URL to its /api URL")
            if time.monotonic() > deadline:
                raise NoPrefectServer(f"the local Prefect server did not answer within {STARTUP_TIMEOUT_S:.0f} s (see "
                                      f"{logfile}); start one yourself and set PREFECT_API_URL to its /api URL")
            time.sleep(1)
        log(f"Prefect UI: http://{HOST}:{port} (API {api_url})")
        yield proc
    finally:
        stop(proc)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (uvicorn and its services), SIGKILL if it does not stop in time."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _restore_env(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value
