"""MLflow tracking adapter: one run per stage with params, metrics, artifacts, models and lineage tags (or a no-op)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from urllib.parse import urlparse

import yaml
from pydantic import BaseModel

from trainlab.atomic import process_lock
from trainlab.errors import TrackingUnavailable

if TYPE_CHECKING:
    import torch

    from trainlab.config import Params

# MLflow 3 sends usage telemetry by default; this pipeline runs offline and must not touch the network.
# setdefault: a user who sets the variable explicitly keeps their choice. Read when mlflow is used, so
# setting it before the (lazy) import below is enough.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

PARENT_RUN_ENV = "TRAINLAB_PARENT_RUN_ID"
DEFAULT_DB_NAME = "mlflow.db"
ARTIFACTS_DIR = "mlartifacts"
LOCK_FILE = "dvc.lock"
DVC_EXP_NAME_ENV = "DVC_EXP_NAME"  # set by `dvc exp run`, and by the flows for their experiments and sweep points
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"

_LOCKED_MARKER = "database is locked"
_RETRY_TRIES = 5
_RETRY_BASE_DELAY_S = 0.2
# A private RNG for retry jitter: the global `random` stream belongs to the seeded training code.
_jitter = random.Random()

T = TypeVar("T")


class Tracker(Protocol):
    """What the engine and the stages may call: MlflowTracker and NullTracker both provide it."""

    run_id: str

    def log_params(self, params: Mapping[str, Any] | BaseModel) -> None: ...
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None: ...
    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None: ...
    def log_dict(self, data: Any, artifact_file: str) -> None: ...
    def log_figure(self, fig: Any, artifact_file: str) -> None: ...
    def log_text(self, text: str, artifact_file: str) -> None: ...
    def set_tags(self, tags: Mapping[str, Any]) -> None: ...
    def log_model(self, model: torch.nn.Module, name: str, input_example: Any,
                  registered_model_name: str | None = None) -> str | None: ...


# --------------------------------------------------------------------------------------------------------------------
# Params flattening


def flatten_params(obj: Mapping[str, Any] | BaseModel, prefix: str = "") -> dict[str, str]:
    """Flatten a pydantic model or nested mapping into dotted keys (``classifier.lr``) with string values."""
    if isinstance(obj, BaseModel):
        obj = obj.model_dump(mode="json")
    flat: dict[str, str] = {}
    for key, value in obj.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, BaseModel):
            value = value.model_dump(mode="json")
        if isinstance(value, Mapping):
            flat.update(flatten_params(value, dotted))
        else:
            flat[dotted] = _stringify(value)
    return flat


def _stringify(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        try:
            return json.dumps(list(value))
        except TypeError:
            return str(list(value))
    return str(value)


# --------------------------------------------------------------------------------------------------------------------
# Secrets: credentials come from the environment (MLFLOW_TRACKING_PASSWORD, AWS_SECRET_ACCESS_KEY, ...) and are
# never logged; a password inside a URL, or a value under a secret-looking key, is masked wherever we log or print.

MASK = "***"
_SECRET_KEY_RE = re.compile(r"(^|[_.-])(password|passwd|secret|token|api[_-]?key|access[_-]?key|secret[_-]?key|"
                            r"credentials?|private[_-]?key)$", re.I)
_URL_CREDENTIALS_RE = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/@:\s]*):(?P<password>[^/\s]*)@")


def redact(text: str) -> str:
    """`text` with the password of every ``scheme://user:password@host`` URL in it masked."""
    return _URL_CREDENTIALS_RE.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)


def redact_value(key: str, value: Any) -> Any:
    """A value to log under `key`: masked whole when the key names a secret, URL passwords masked otherwise."""
    if isinstance(value, Mapping):
        return {k: redact_value(str(k), v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_value(key, v) for v in value]
    if _SECRET_KEY_RE.search(key.rsplit(".", 1)[-1]) and value not in (None, ""):
        return MASK
    return redact(value) if isinstance(value, str) else value


# --------------------------------------------------------------------------------------------------------------------
# Tracking URI


def default_tracking_uri() -> str:
    """``sqlite:///<cwd>/mlflow.db`` with an absolute path (cwd is the repo root where dvc runs)."""
    return f"sqlite:///{(Path.cwd() / DEFAULT_DB_NAME).resolve()}"


def resolve_tracking_uri(params: Params, check: bool = False) -> str:
    """The tracking URI: ``tracking.uri``, else ``$MLFLOW_TRACKING_URI``, else the local SQLite DB in the cwd.

    Relative SQLite paths are made absolute (against the cwd). With ``check=True`` an http(s) URI is probed
    first: unreachable raises TrackingUnavailable, or with ``tracking.fallback_to_local`` warns and returns
    the local default instead.
    """
    uri, source = _configured_uri(params)
    uri = _normalise_uri(uri)
    if check and _is_http(uri):
        reason = _probe_health(uri, params.tracking.connect_timeout_s)
        if reason is not None:
            local = default_tracking_uri()
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


def mlflow_client(uri: str) -> Any:
    """An MlflowClient whose model registry is the tracking store itself.

    Without ``registry_uri`` MLflow takes the process-global registry URI (``mlflow.set_registry_uri`` or
    ``MLFLOW_REGISTRY_URI``), so a leftover global setting would register models in some other store.
    """
    import mlflow

    return mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)


def _configured_uri(params: Params) -> tuple[str, str]:
    if params.tracking.uri:
        return params.tracking.uri, "tracking.uri"
    env = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    if env:
        return env, "MLFLOW_TRACKING_URI"
    return default_tracking_uri(), "default"


def _is_http(uri: str) -> bool:
    return uri.lower().startswith(("http://", "https://"))


def _normalise_uri(uri: str) -> str:
    """Absolute SQLite paths (so artifacts can sit beside the DB); a bare ``*.db`` path becomes a SQLite URI."""
    if "://" not in uri and uri.endswith((".db", ".sqlite", ".sqlite3")):
        return f"sqlite:///{Path(uri).expanduser().resolve()}"
    db = _sqlite_path(uri)
    if db is None:
        return uri
    query = uri.partition("?")[2]
    return f"sqlite:///{db}" + (f"?{query}" if query else "")


def _sqlite_path(uri: str) -> Path | None:
    """The absolute DB file of a ``sqlite:///`` URI, or None (not SQLite, or in memory)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///"):].partition("?")[0]
    if not path or path == ":memory:":
        return None
    return Path(path).expanduser().resolve()


def _artifact_location(uri: str, experiment: str) -> str | None:
    """Where a new experiment's artifacts go: ``<db folder>/mlartifacts/<experiment>`` for local stores.

    None for http(s) servers (the server decides, e.g. ``--serve-artifacts``).
    """
    if _is_http(uri) or uri.startswith("databricks"):
        return None
    db = _sqlite_path(uri)
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


# --------------------------------------------------------------------------------------------------------------------
# Lineage: data hash from dvc.lock


def data_hash(stage: str, lock_path: str | os.PathLike = LOCK_FILE) -> str:
    """A short hash over the md5s of ``stage``'s deps in dvc.lock; 'none' when there is no lock or no such stage.

    dvc writes a stage's own lock entry only after the stage finishes, so while it runs its dep entries describe
    the previous run; for a dep that is an upstream stage's out, the upstream entry (already rewritten when that
    stage ran) is preferred.
    """
    path = Path(lock_path)
    if not path.is_file():
        return "none"
    try:
        lock = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return "unreadable"
    stages = lock.get("stages") if isinstance(lock, dict) else None
    if not isinstance(stages, dict) or not isinstance(stages.get(stage), dict):
        return "none"
    fresh_outs: dict[str, str] = {}
    for name, entry in stages.items():
        if name != stage and isinstance(entry, dict):
            for out in entry.get("outs") or []:
                if isinstance(out, dict) and out.get("path") and _entry_hash(out):
                    fresh_outs[str(out["path"]).rstrip("/")] = _entry_hash(out)
    lines = []
    for dep in stages[stage].get("deps") or []:
        if not isinstance(dep, dict) or not dep.get("path"):
            continue
        dep_path = str(dep["path"]).rstrip("/")
        lines.append(f"{dep_path}\t{fresh_outs.get(dep_path) or _entry_hash(dep) or 'missing'}")
    if not lines:
        return "none"
    return hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()[:12]


def _entry_hash(entry: dict) -> str:
    for key in ("md5", "etag", "checksum"):
        if entry.get(key):
            return str(entry[key])
    return ""


# --------------------------------------------------------------------------------------------------------------------
# SQLite "database is locked" retries


def _is_locked(exc: BaseException | None) -> bool:
    seen = set()
    while exc is not None and id(exc) not in seen:
        if _LOCKED_MARKER in str(exc).lower():
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def _retry(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call an MLflow client function, retrying with jittered backoff when SQLite says 'database is locked'."""
    for attempt in range(_RETRY_TRIES):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if attempt == _RETRY_TRIES - 1 or not _is_locked(exc):
                raise
            time.sleep(_RETRY_BASE_DELAY_S * 2**attempt * (0.5 + _jitter.random()))
    raise AssertionError("unreachable")


def _already_exists(exc: BaseException) -> bool:
    code = getattr(exc, "error_code", "")
    return code in ("RESOURCE_ALREADY_EXISTS", "ALREADY_EXISTS") or "already exists" in str(exc).lower()


@contextmanager
def _global_tracking_uri(uri: str) -> Iterator[None]:
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


# --------------------------------------------------------------------------------------------------------------------
# Trackers


class NullTracker:
    """Tracking disabled: every method is a no-op and ``run_id`` is ''."""

    run_id = ""
    experiment_id = ""
    tracking_uri = ""
    last_model_uri: str | None = None

    def log_params(self, params: Mapping[str, Any] | BaseModel) -> None:
        pass

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        pass

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        pass

    def log_dict(self, data: Any, artifact_file: str) -> None:
        pass

    def log_figure(self, fig: Any, artifact_file: str) -> None:
        pass

    def log_text(self, text: str, artifact_file: str) -> None:
        pass

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        pass

    def log_model(self, model: torch.nn.Module, name: str, input_example: Any,
                  registered_model_name: str | None = None) -> str | None:
        return None


class MlflowTracker:
    """One MLflow run, written through an explicit MlflowClient (no fluent active-run state)."""

    end_deferred = False  # True: start_run leaves ending the run to a QueuedTracker (trainlab.tracking_queue)

    def __init__(self, client: Any, run_id: str, experiment_id: str, tracking_uri: str,
                 register_models: bool = True) -> None:
        self._client = client
        self.run_id = run_id
        self.experiment_id = experiment_id
        self.tracking_uri = tracking_uri
        self.register_models = register_models
        self.last_model_uri: str | None = None

    # -- params, metrics, tags -------------------------------------------------------------------------------------

    def log_params(self, params: Mapping[str, Any] | BaseModel) -> None:
        """Log (nested) params as dotted keys with string values, in batches MLflow accepts."""
        from mlflow.entities import Param
        from mlflow.utils.validation import MAX_PARAMS_TAGS_PER_BATCH

        items = [Param(k, redact_value(k, v)) for k, v in flatten_params(params).items()]
        for chunk in _chunks(items, MAX_PARAMS_TAGS_PER_BATCH):
            _retry(self._client.log_batch, self.run_id, params=chunk)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None,
                    timestamp_ms: int | None = None) -> None:
        """Log metrics at ``step`` (0 when None) and ``timestamp_ms`` (now when None); NaN/inf values are skipped
        with a warning."""
        from mlflow.entities import Metric
        from mlflow.utils.validation import MAX_METRICS_PER_BATCH

        timestamp = int(time.time() * 1000) if timestamp_ms is None else int(timestamp_ms)
        items, skipped = [], []
        for key, value in metrics.items():
            try:
                number = float(value)
            except (TypeError, ValueError):
                raise TypeError(f"metric {key!r}: expected a number, got {type(value).__name__}") from None
            if math.isfinite(number):
                items.append(Metric(key, number, timestamp, int(step or 0)))
            else:
                skipped.append(f"{key}={number}")
        if skipped:
            warnings.warn(f"not logging non-finite metric values at step {step}: {', '.join(skipped)}",
                          RuntimeWarning, stacklevel=2)
        for chunk in _chunks(items, MAX_METRICS_PER_BATCH):
            _retry(self._client.log_batch, self.run_id, metrics=chunk)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag
        from mlflow.utils.validation import MAX_PARAMS_TAGS_PER_BATCH

        items = [RunTag(str(k), redact_value(str(k), _stringify(v))) for k, v in tags.items()]
        for chunk in _chunks(items, MAX_PARAMS_TAGS_PER_BATCH):
            _retry(self._client.log_batch, self.run_id, tags=chunk)

    # -- artifacts -------------------------------------------------------------------------------------------------

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        """Log a file, or a directory (kept under its own name), optionally inside ``artifact_path``."""
        local = Path(path)
        if not local.exists():
            raise FileNotFoundError(f"cannot log artifact {local}: no such file or directory")
        _retry(self._client.log_artifact, self.run_id, str(local), artifact_path)

    def log_dict(self, data: Any, artifact_file: str) -> None:
        """Log a JSON (``.json``) or YAML (``.yaml``/``.yml``) artifact."""
        _retry(self._client.log_dict, self.run_id, redact_value("", data), artifact_file)

    def log_figure(self, fig: Any, artifact_file: str) -> None:
        """Log a matplotlib figure (PNG unless ``artifact_file`` names another image format)."""
        if not Path(artifact_file).suffix:
            artifact_file += ".png"
        _retry(self._client.log_figure, self.run_id, fig, artifact_file)

    def log_text(self, text: str, artifact_file: str) -> None:
        _retry(self._client.log_text, self.run_id, text, artifact_file)

    # -- models ----------------------------------------------------------------------------------------------------

    def log_model(self, model: torch.nn.Module, name: str, input_example: Any,
                  registered_model_name: str | None = None) -> str | None:
        """Log a torch model (``name=``, MLflow 3) with an input example; register it when asked and allowed.

        Saved in MLflow's safe 'pt2' format (torch.export of a CPU, eval-mode copy); a model that cannot be
        exported falls back to 'pickle' with a warning. Pip requirements are pinned from the installed packages
        (no inference subprocess, no network). Returns the registered version, or None when not registered
        (no name given, or ``tracking.register_models`` is false).
        """
        if input_example is None:
            raise ValueError(f"log_model({name!r}): an input_example (a small batch) is required to trace and "
                             "describe the model")
        example = _example_array(input_example)
        export_model, restore = _exportable(model)
        try:
            with _global_tracking_uri(self.tracking_uri), warnings.catch_warnings():
                # torch.export.save says this for channels_last weights; harmless for a CPU model.
                warnings.filterwarnings("ignore", message="No complete tensor found in the group",
                                        category=UserWarning)
                info = self._log_model_as(export_model, name, example, "pt2", fallback=True)
        finally:
            restore()
        self.last_model_uri = info.model_uri
        if not registered_model_name or not self.register_models:
            return None
        return self._register(info.model_id, registered_model_name)

    def _log_model_as(self, model: Any, name: str, example: Any, fmt: str, fallback: bool) -> Any:
        import mlflow
        import mlflow.pytorch

        run_params = _retry(self._client.get_run, self.run_id).data.params
        # Create the LoggedModel explicitly: without an active fluent run, log_model(run_id=...) alone would file
        # the model under the Default experiment ('0') and its ./mlruns artifact root.
        logged = _retry(mlflow.initialize_logged_model, name=name, source_run_id=self.run_id,
                        experiment_id=self.experiment_id, params=run_params)
        try:
            return mlflow.pytorch.log_model(
                model, name=name, input_example=example, run_id=self.run_id, model_id=logged.model_id,
                serialization_format=fmt, pip_requirements=mlflow.pytorch.get_default_pip_requirements())
        except Exception as exc:
            try:
                self._client.delete_logged_model(logged.model_id)
            except Exception:  # noqa: BLE001 - best-effort cleanup of the empty model entry
                pass
            if not fallback or not _raised_by_torch_export(exc):
                raise
            first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            print(f"warning: torch.export could not trace model {name!r} ({type(exc).__name__}: {first_line}); "
                  "logging it in MLflow's pickle format instead", file=sys.stderr)
            return self._log_model_as(model, name, example, "pickle", fallback=False)

    def _register(self, model_id: str, registered_model_name: str) -> str:
        """Register ``models:/<model_id>`` as a new version (quietly, race-safely) and link it on the model."""
        from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS

        try:
            _retry(self._client.create_registered_model, registered_model_name)
        except Exception as exc:
            if not _already_exists(exc):
                raise
        # The SQL registry resolves `models:/<id>` with MlflowClient(): the global tracking URI (an MLflow TODO).
        with _global_tracking_uri(self.tracking_uri):
            version = _retry(self._client.create_model_version, name=registered_model_name,
                             source=f"models:/{model_id}", run_id=self.run_id, model_id=model_id)
        try:
            logged = self._client.get_logged_model(model_id)
            links = json.loads(logged.tags.get(MLFLOW_MODEL_VERSIONS, "[]"))
            links.append({"name": version.name, "version": version.version})
            _retry(self._client.set_logged_model_tags, model_id, {MLFLOW_MODEL_VERSIONS: json.dumps(links)})
        except Exception as exc:  # noqa: BLE001 - the version exists; the UI link is a nicety
            warnings.warn(f"registered {registered_model_name} v{version.version} but could not link it on "
                          f"the logged model: {exc}", RuntimeWarning, stacklevel=3)
        return str(version.version)


def _raised_by_torch_export(exc: BaseException) -> bool:
    """True when the error came out of torch.export tracing (not from MLflow, the store or the network)."""
    import traceback

    markers = ("/torch/export/", "/torch/_export/", "/torch/_dynamo/")
    frames = traceback.extract_tb(exc.__traceback__)
    return type(exc).__module__.startswith("torch.") or any(m in f.filename.replace("\\", "/")
                                                          for f in frames for m in markers)


def _chunks(items: list[T], size: int) -> Iterator[list[T]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _example_array(example: Any) -> Any:
    """A small numpy input example (first rows only, float32 for low-precision floats)."""
    import numpy as np
    import torch

    if isinstance(example, torch.Tensor):
        example = example.detach().cpu()
        if example.is_floating_point() and example.dtype != torch.float64:
            example = example.float()
        example = example.numpy()
    example = np.asarray(example)
    if example.ndim >= 1 and example.shape[0] > 2:
        example = example[:2]  # keep input_example.json small; >1 row keeps the batch dimension dynamic
    return np.ascontiguousarray(example)


def _exportable(model: torch.nn.Module) -> tuple[torch.nn.Module, Callable[[], None]]:
    """An eval-mode CPU model to export (a copy if it lives elsewhere), and how to restore the original's mode."""
    import copy

    import torch

    model = getattr(model, "_orig_mod", model)  # unwrap torch.compile
    if isinstance(model, (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)):
        model = model.module
    on_cpu = all(p.device.type == "cpu" for p in model.parameters())
    has_low_precision = any(p.is_floating_point() and p.dtype in (torch.float16, torch.bfloat16)
                            for p in model.parameters())
    if on_cpu and not has_low_precision:
        was_training = model.training
        model.eval()
        return model, lambda: model.train(was_training)
    clone = copy.deepcopy(model).to("cpu").float().eval()
    return clone, lambda: None


# --------------------------------------------------------------------------------------------------------------------
# Runs


@dataclass(frozen=True)
class DataInput:
    """A data split a run reads, logged as an MLflow dataset input: its name, source path, and context
    (training / validation / test); the digest is the file's md5, the hash DVC records for it."""

    name: str
    path: str
    context: str


SPLIT_CONTEXTS = {"train": "training", "val": "validation", "test": "test"}


def split_inputs(data_dir: str | os.PathLike, splits: Sequence[str] = ("train", "val", "test")) -> list[DataInput]:
    """The DataInputs of a prepared-data folder's splits (``<folder>/<split>.safetensors``)."""
    folder = Path(data_dir)
    return [DataInput(f"{folder.name}/{split}", str(folder / f"{split}.safetensors"), SPLIT_CONTEXTS[split])
            for split in splits]


def file_md5(path: str | os.PathLike) -> str:
    """The md5 of a file's bytes: what DVC 3 records as the file's hash (in dvc.lock and in a folder's .dir)."""
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _dataset_inputs(inputs: Sequence[DataInput]) -> list[Any]:
    from mlflow.entities import Dataset, DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    return [DatasetInput(Dataset(name=i.name, digest=file_md5(i.path), source_type="local",
                                 source=json.dumps({"uri": i.path})),
                         tags=[InputTag(MLFLOW_DATASET_CONTEXT, i.context)]) for i in inputs]


def default_run_name(stage: str, git: Mapping[str, str]) -> str:
    """What the runs table shows: the DVC experiment (or sweep point) and the stage, else the stage and the short
    commit (``-dirty`` with uncommitted changes). Set here, so MLflow never draws a name from the seeded `random`."""
    experiment = os.environ.get(DVC_EXP_NAME_ENV, "").strip()
    if experiment:
        return f"{experiment} {stage}"
    commit = str(git.get("git_commit") or "unknown")
    short = commit[:7] if commit != "unknown" else "no-git"
    return f"{stage} {short}" + ("-dirty" if git.get("git_dirty") == "true" else "")


@contextmanager
def start_run(params: Params, stage: str, run_name: str | None = None, parent_run_id: str | None = None,
              tags: Mapping[str, Any] | None = None, device: str | None = None,
              datasets: Sequence[DataInput] = ()) -> Iterator[MlflowTracker | NullTracker]:
    """One MLflow run for a stage; yields a tracker. The run ends FAILED if the body raises, else FINISHED.

    With ``tracking.enabled`` false, yields a NullTracker and touches nothing. ``parent_run_id`` (or
    ``$TRAINLAB_PARENT_RUN_ID``) nests the run. Tags: git_commit, git_dirty, stage, params_hash, data_hash,
    device, torch_version; the environment record is logged as ``environment.json``. ``device`` names the
    device the stage runs on (default: resolved from ``base.device``). ``run_name`` defaults to
    `default_run_name`; ``datasets`` are logged as the run's dataset inputs.
    """
    if not params.tracking.enabled:
        yield NullTracker()
        return

    uri = resolve_tracking_uri(params, check=True)  # probes http(s) servers before importing mlflow
    from trainlab.tracking_queue import configure_http
    configure_http(params.tracking.request_timeout_s, params.tracking.request_retries)

    from mlflow.entities import RunStatus

    db = _sqlite_path(uri)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
    # MLflow 3.17's SQLAlchemy stores create and migrate a fresh DB without a lock (the client does it on
    # construction), so processes starting together on a new mlflow.db break each other's migration:
    # serialise the first touch and the experiment's get-or-create across processes.
    with process_lock(f"mlflow-init:{db}") if db is not None else nullcontext():
        client = mlflow_client(uri)
        experiment_id = _ensure_experiment(client, params.tracking.experiment,
                                           _artifact_location(uri, params.tracking.experiment))

    run_tags = _run_tags(params, stage, device)
    parent = parent_run_id or os.environ.get(PARENT_RUN_ENV, "").strip() or None
    if parent:
        if _run_exists(client, parent):
            run_tags["mlflow.parentRunId"] = parent
        else:
            print(f"warning: parent run {parent} not found in {redact(uri)}; not nesting this run", file=sys.stderr)
    run_tags.update({str(k): redact_value(str(k), _stringify(v)) for k, v in (tags or {}).items()})
    run_name = run_name or default_run_name(stage, run_tags)
    run = _retry(client.create_run, experiment_id, tags=run_tags, run_name=run_name)
    if datasets:
        _retry(client.log_inputs, run.info.run_id, datasets=_dataset_inputs(datasets))
    tracker = MlflowTracker(client, run.info.run_id, experiment_id, uri, params.tracking.register_models)

    status, body_raised = RunStatus.to_string(RunStatus.FINISHED), False
    try:
        tracker.log_dict(_environment(device_tag=run_tags.get("device")), "environment.json")
        yield tracker
    except BaseException as exc:
        body_raised = True
        if isinstance(exc, KeyboardInterrupt):
            status = RunStatus.to_string(RunStatus.KILLED)
        elif not (isinstance(exc, SystemExit) and exc.code in (None, 0)):
            status = RunStatus.to_string(RunStatus.FAILED)
        raise
    finally:
        try:
            if not tracker.end_deferred:
                _retry(client.set_terminated, tracker.run_id, status)
        except Exception as exc:
            if not body_raised:
                raise
            print(f"warning: could not mark MLflow run {tracker.run_id} {status}: {exc}", file=sys.stderr)


class PendingTracker:
    """The tracker of a run that `start_run_in_background` is opening on a thread.

    Logging calls made before the run is open are queued and replayed, in order, by the first call after it is;
    anything else (``run_id``, ``log_model``, ...) waits for it. If opening fails, ``failed`` is set and every later
    call raises the error opening raised."""

    _QUEUEABLE = frozenset({"log_params", "log_metrics", "set_tags", "log_dict", "log_text"})

    def __init__(self, opening: Future) -> None:
        self._opening = opening
        self._queued: list[tuple[str, tuple, dict]] = []
        self.failed = threading.Event()
        opening.add_done_callback(lambda f: self.failed.set() if f.exception() is not None else None)

    def wait(self) -> MlflowTracker:
        """The open run's tracker, once every queued call has been made on it; raises what opening raised."""
        tracker = self._opening.result()
        while self._queued:
            name, args, kwargs = self._queued.pop(0)
            getattr(tracker, name)(*args, **kwargs)
        return tracker

    def opening_error(self) -> BaseException | None:
        """What opening the run raised (None if it opened), once opening has finished."""
        return self._opening.exception()

    def __getattr__(self, name: str) -> Any:
        if name not in self._QUEUEABLE:
            return getattr(self.wait(), name)

        def call(*args: Any, **kwargs: Any) -> None:
            if self._opening.done():
                getattr(self.wait(), name)(*args, **kwargs)
            else:
                self._queued.append((name, args, kwargs))

        return call


@contextmanager
def start_run_in_background(params: Params, stage: str, spool_key: str | None = None,
                            outputs: tuple[Path, ...] = (), **kwargs: Any) -> Iterator[PendingTracker | NullTracker]:
    """`start_run` on a thread, so that importing MLflow and opening its store (about 1.5 s on a 2-core CPU) overlap
    the caller's work instead of delaying it: a training stage's first step comes that much sooner. Every logging
    call goes through a bounded queue to a background thread (`trainlab.tracking_queue.QueuedTracker`), so training
    never waits on the server; a server that went away and is not back `tracking.outage_grace_s` after the body ends
    gets the calls left spooled under `spool_key` with copies of `outputs`, and TrackingOutage (exit 6).

    The caller should pass the tracker's ``failed`` event to `fit(stop=...)`, so training stops at its next step
    (with a checkpoint to resume from) if the run cannot be opened; that error is then what this raises."""
    if not params.tracking.enabled:
        yield NullTracker()
        return
    from trainlab.tracking_queue import queued_run

    with queued_run(start_run(params, stage, **kwargs), params.tracking, stage, spool_key, outputs) as tracker:
        yield tracker


def _ensure_experiment(client: Any, name: str, artifact_location: str | None) -> str:
    """The experiment's id, creating it if needed; safe when several processes create it at once.

    It carries ``mlflow.experimentKind = custom_model_development`` (added to an existing experiment that has no
    kind), so MLflow 3's UI opens it in the model-training view rather than the GenAI one."""
    experiment = _retry(client.get_experiment_by_name, name)
    if experiment is None:
        try:
            return _retry(client.create_experiment, name, artifact_location=artifact_location,
                          tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
        except Exception:
            # Most likely another process created it between our get and create: use theirs.
            experiment = _retry(client.get_experiment_by_name, name)
            if experiment is None:
                raise
    if experiment.lifecycle_stage == "deleted":
        raise TrackingUnavailable(
            f"MLflow experiment {name!r} is deleted; restore it (`mlflow experiments restore "
            f"--experiment-id {experiment.experiment_id}`) or set another `tracking.experiment` in params.yaml")
    if EXPERIMENT_KIND_TAG not in (experiment.tags or {}):
        _retry(client.set_experiment_tag, experiment.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    return experiment.experiment_id


def _run_exists(client: Any, run_id: str) -> bool:
    try:
        _retry(client.get_run, run_id)
        return True
    except Exception as exc:
        if getattr(exc, "error_code", "") in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            return False
        raise


def _resolve_device_name(params: Params, device: str | None) -> str:
    if device:
        return str(device)
    try:
        from trainlab.runtime import resolve_device

        return str(resolve_device(params.base.device))
    except Exception:  # noqa: BLE001 - a tag must never stop a run
        return params.base.device


def _run_tags(params: Params, stage: str, device: str | None) -> dict[str, str]:
    import torch

    from trainlab.repro import git_state

    tags: dict[str, str] = {}
    try:  # mlflow's own context tags (user, source name/type), as the fluent API would add them
        from mlflow.tracking.context.registry import resolve_tags

        tags.update({k: str(v) for k, v in resolve_tags({}).items()})
    except Exception:  # noqa: BLE001 - cosmetic
        pass
    tags.update(git_state())
    tags.update({
        "stage": stage,
        "params_hash": params.section_hash(),
        "data_hash": data_hash(stage),
        "device": _resolve_device_name(params, device),
        "torch_version": torch.__version__,
    })
    return tags


def _environment(device_tag: str | None) -> dict[str, str]:
    import torch

    from trainlab.repro import environment

    try:
        dev = torch.device(device_tag) if device_tag else None
    except (RuntimeError, TypeError):
        dev = None
    try:
        return environment(dev)
    except Exception:  # noqa: BLE001 - e.g. a CUDA query failing; record what we can
        return environment(None)
