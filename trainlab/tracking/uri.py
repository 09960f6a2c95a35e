"""Which MLflow store a stage logs to: the tracking URI from params or the environment, checked and normalised."""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from trainlab.core.errors import TrackingUnavailable
from trainlab.tracking.secrets import redact

if TYPE_CHECKING:
    from trainlab.core.config import Params


DEFAULT_DB_NAME = "mlflow.db"
ARTIFACTS_DIR = "mlartifacts"


def default_tracking_uri(root: str | os.PathLike | None = None) -> str:
    """``sqlite:///<root>/mlflow.db`` with an absolute path; root defaults to the cwd (the repo root where dvc runs)."""
    return f"sqlite:///{(Path(root or Path.cwd()) / DEFAULT_DB_NAME).resolve()}"


def resolve_tracking_uri(params: Params, check: bool = False, root: str | os.PathLike | None = None) -> str:
    """The tracking URI: ``tracking.uri``, else ``$MLFLOW_TRACKING_URI``, else the local SQLite DB in `root`.

    Relative SQLite paths are made absolute against `root` (default: the cwd), so experiments in other folders log
    to the same store. With ``check=True`` an http(s) URI is probed first: unreachable raises TrackingUnavailable,
    or with ``tracking.fallback_to_local`` warns and returns the local default instead.
    """
    uri, source = _configured_uri(params, root)
    uri = _normalise_uri(uri, root)
    if check and _is_http(uri):
        reason = _probe_health(uri, params.tracking.connect_timeout_s)
        if reason is not None:
            local = default_tracking_uri(root)
            shown = redact(uri)
            if params.tracking.fallback_to_local:
                print(f"warning: MLflow server {shown} ({source}) is unreachable ({reason}); "
                      f"logging to {local} instead (tracking.fallback_to_local is true)", file=sys.stderr)
                return local
            raise TrackingUnavailable(
                f"MLflow tracking server {shown} (from {source}) is unreachable: {reason} "
                f"(probed {shown.rstrip('/')}/health, timeout {params.tracking.connect_timeout_s:g}s). "
                f"Start the server, or set `tracking.fallback_to_local: true` in params.yaml to log to {local}, "
                f"or unset {'tracking.uri' if source == 'tracking.uri' else 'MLFLOW_TRACKING_URI'} "
                "to use the local SQLite store.")
    return uri


def configure_http(request_timeout_s: int, request_retries: int) -> None:
    """Bound each MLflow HTTP request (MLflow's defaults retry one request for minutes): read per request."""
    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(int(request_timeout_s))
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = str(int(request_retries))
    os.environ["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"] = "1"


def mlflow_client(uri: str) -> Any:
    """An MlflowClient whose model registry is the tracking store itself.

    Without ``registry_uri`` MLflow takes the process-global registry URI (``mlflow.set_registry_uri`` or
    ``MLFLOW_REGISTRY_URI``), so a leftover global setting would register models in some other store.
    """
    import mlflow

    return mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)


def _configured_uri(params: Params, root: str | os.PathLike | None = None) -> tuple[str, str]:
    if params.tracking.uri:
        return params.tracking.uri, "tracking.uri"
    env = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    if env:
        return env, "MLFLOW_TRACKING_URI"
    return default_tracking_uri(root), "default"


def _is_http(uri: str) -> bool:
    return uri.lower().startswith(("http://", "https://"))


def _normalise_uri(uri: str, root: str | os.PathLike | None = None) -> str:
    """Absolute SQLite paths, relative ones taken from `root` (so artifacts can sit beside the DB); a bare ``*.db``
    path becomes a SQLite URI."""
    base = Path(root or Path.cwd())
    if "://" not in uri and uri.endswith((".db", ".sqlite", ".sqlite3")):
        return f"sqlite:///{(base / Path(uri).expanduser()).resolve()}"
    db = sqlite_path(uri, base)
    if db is None:
        return uri
    query = uri.partition("?")[2]
    return f"sqlite:///{db}" + (f"?{query}" if query else "")


def sqlite_path(uri: str, root: str | os.PathLike | None = None) -> Path | None:
    """The absolute DB file of a ``sqlite:///`` URI (a relative path taken from `root`, default the cwd), or None
    (not SQLite, or in memory)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///"):].partition("?")[0]
    if not path or path == ":memory:":
        return None
    return (Path(root or Path.cwd()) / Path(path).expanduser()).resolve()


def artifact_location(uri: str, experiment: str) -> str | None:
    """Where a new experiment's artifacts go: ``<db folder>/mlartifacts/<experiment>`` for local stores.

    None for http(s) servers (the server decides, e.g. ``--serve-artifacts``).
    """
    if _is_http(uri) or uri.startswith("databricks"):
        return None
    db = sqlite_path(uri)
    if db is not None:
        base = db.parent
    elif uri.startswith("file:"):
        base = Path(urlparse(uri).path).parent  # beside a file store's folder, never inside it
    else:
        base = Path.cwd()
    folder = re.sub(r"[^A-Za-z0-9._-]+", "_", experiment).strip("_") or "experiment"
    return (base / ARTIFACTS_DIR / folder).resolve().as_uri()


def _probe_health(uri: str, timeout_s: float) -> str | None:
    """None when ``<uri>/health`` answers; otherwise why not. Total time is bounded by ``timeout_s``."""
    import requests

    url = f"{uri.rstrip('/')}/health"
    outcome: dict[str, Any] = {}

    def probe() -> None:
        try:
            outcome["status"] = requests.get(url, timeout=(timeout_s, timeout_s)).status_code
        except requests.RequestException as exc:
            outcome["error"] = type(exc).__name__
        except Exception as exc:  # noqa: BLE001 - anything at all means "not reachable"
            outcome["error"] = f"{type(exc).__name__}: {exc}"

    worker = threading.Thread(target=probe, name="mlflow-health-probe", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        return f"no answer within {timeout_s:g}s"
    if "error" in outcome:
        return f"connection failed: {outcome['error']}"
    status = outcome["status"]
    if status >= 500:
        return f"/health answered HTTP {status}"
    return None  # 2xx, or 3xx/4xx: a server answered; MLflow's own calls report anything more specific


@contextmanager
def global_tracking_uri(uri: str) -> Iterator[None]:
    """Point mlflow's process-global tracking URI at ``uri`` for calls that only read the global one
    (log_model; the registry's create_model_version), then put back exactly what was there.

    ``mlflow.set_tracking_uri`` also writes $MLFLOW_TRACKING_URI, so the global and the variable are saved apart:
    restoring through get_tracking_uri() would turn a caller's environment variable into a sticky global.
    """
    import mlflow
    from mlflow.tracking._tracking_service import utils as tracking_utils

    saved_global, saved_env = tracking_utils._tracking_uri, os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(saved_global)  # None also removes the variable
        if saved_env is not None:
            os.environ["MLFLOW_TRACKING_URI"] = saved_env


def probe_tracking(params: Params) -> None:
    """Report an unreachable MLflow server now, before torch and the stage's work load (exit 6 within seconds);
    when `tracking.fallback_to_local` chose the local store instead, the stage logs there."""
    if not params.tracking.enabled:
        return
    uri = resolve_tracking_uri(params, check=True)
    if uri != resolve_tracking_uri(params):
        params.tracking.uri = uri
