"""Two of the three Trackers (trainlab.engine.contract.Tracker): MlflowTracker (one MLflow run, written directly) and
NullTracker (tracking off); the third, the background queue of a training stage, is trainlab.tracking.queue. The
checks of what a stage asks to log are here, one for all three: the same call fails the same way whatever tracks it."""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel

from trainlab.core.flatten import stringify, strings
from trainlab.serving import flavor
from trainlab.tracking.registry import crown_if_none
from trainlab.tracking.retry import already_exists, retry
from trainlab.tracking.secrets import redact_value
from trainlab.tracking.uri import global_tracking_uri

if TYPE_CHECKING:
    import torch

T = TypeVar("T")


def flatten_params(obj: Mapping[str, Any] | BaseModel) -> dict[str, str]:
    """A pydantic model or nested mapping as dotted keys (``classifier.lr``) with string values."""
    return strings(obj)


def metric_values(metrics: Mapping[str, Any], step: int | None) -> dict[str, float]:
    """The finite metric values as floats; a value that is not a number is a TypeError naming its key, a NaN or
    infinite one is left out with a warning (MLflow would store it, and every chart of it would break)."""
    values, skipped = {}, []
    for key, value in metrics.items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise TypeError(f"metric {key!r}: expected a number, got {type(value).__name__}") from None
        if math.isfinite(number):
            values[key] = number
        else:
            skipped.append(f"{key}={number}")
    if skipped:
        warnings.warn(f"not logging non-finite metric values at step {step}: {', '.join(skipped)}",
                      RuntimeWarning, stacklevel=3)
    return values


def artifact_file(path: str | os.PathLike) -> Path:
    """`path` as a Path, checked to exist (a file, or a directory logged under its own name)."""
    local = Path(path)
    if not local.exists():
        raise FileNotFoundError(f"cannot log artifact {local}: no such file or directory")
    return local


def check_model_call(name: str, input_example: Any) -> None:
    if input_example is None:
        raise ValueError(f"log_model({name!r}): an input_example (a small batch) is required to trace and "
                         "describe the model")


class NullTracker:
    """Tracking disabled: nothing is logged (the calls are checked as the other trackers check them); ``run_id`` is
    '' and ``failed`` is never set."""

    run_id = ""
    experiment_id = ""
    tracking_uri = ""
    last_model_uri: str | None = None

    def __init__(self) -> None:
        self.failed = threading.Event()

    def log_params(self, params: Mapping[str, Any] | BaseModel) -> None:
        flatten_params(params)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        metric_values(metrics, step)

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        artifact_file(path)

    def log_dict(self, data: Any, artifact_file: str) -> None:
        pass

    def log_figure(self, fig: Any, artifact_file: str) -> None:
        pass

    def log_text(self, text: str, artifact_file: str) -> None:
        pass

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        pass

    def log_model(self, model: torch.nn.Module, name: str, input_example: Any,
                  registered_model_name: str | None = None, model_dir: str | os.PathLike | None = None,
                  raw_example: dict[str, list[Any]] | None = None, tensor_model: bool = False) -> str | None:
        check_model_call(name, input_example)
        return None


class MlflowTracker:
    """One MLflow run, written through an explicit MlflowClient (no fluent active-run state). A call the store refuses
    raises where it is made; ``failed`` is never set."""

    def __init__(self, client: Any, run_id: str, experiment_id: str, tracking_uri: str,
                 register_models: bool = True) -> None:
        self._client = client
        self.run_id = run_id
        self.experiment_id = experiment_id
        self.tracking_uri = tracking_uri
        self.register_models = register_models
        self.last_model_uri: str | None = None
        self.failed = threading.Event()

    # -- params, metrics, tags -------------------------------------------------------------------------------------

    def log_params(self, params: Mapping[str, Any] | BaseModel) -> None:
        """Log (nested) params as dotted keys with string values, in batches MLflow accepts."""
        from mlflow.entities import Param
        from mlflow.utils.validation import MAX_PARAMS_TAGS_PER_BATCH

        items = [Param(k, redact_value(k, v)) for k, v in flatten_params(params).items()]
        for chunk in _chunks(items, MAX_PARAMS_TAGS_PER_BATCH):
            retry(self._client.log_batch, self.run_id, params=chunk)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None,
                    timestamp_ms: int | None = None) -> None:
        """Log metrics at ``step`` (0 when None) and ``timestamp_ms`` (now when None) (see `metric_values`)."""
        from mlflow.entities import Metric
        from mlflow.utils.validation import MAX_METRICS_PER_BATCH

        timestamp = int(time.time() * 1000) if timestamp_ms is None else int(timestamp_ms)
        items = [Metric(key, number, timestamp, int(step or 0)) for key, number in metric_values(metrics, step).items()]
        for chunk in _chunks(items, MAX_METRICS_PER_BATCH):
            retry(self._client.log_batch, self.run_id, metrics=chunk)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag
        from mlflow.utils.validation import MAX_PARAMS_TAGS_PER_BATCH

        items = [RunTag(str(k), redact_value(str(k), stringify(v))) for k, v in tags.items()]
        for chunk in _chunks(items, MAX_PARAMS_TAGS_PER_BATCH):
            retry(self._client.log_batch, self.run_id, tags=chunk)

    # -- artifacts -------------------------------------------------------------------------------------------------

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        """Log a file, or a directory (kept under its own name), optionally inside ``artifact_path``."""
        retry(self._client.log_artifact, self.run_id, str(artifact_file(path)), artifact_path)

    def log_dict(self, data: Any, artifact_file: str) -> None:
        """Log a JSON (``.json``) or YAML (``.yaml``/``.yml``) artifact."""
        retry(self._client.log_dict, self.run_id, redact_value("", data), artifact_file)

    def log_figure(self, fig: Any, artifact_file: str) -> None:
        """Log a matplotlib figure (PNG unless ``artifact_file`` names another image format)."""
        if not Path(artifact_file).suffix:
            artifact_file += ".png"
        retry(self._client.log_figure, self.run_id, fig, artifact_file)

    def log_text(self, text: str, artifact_file: str) -> None:
        retry(self._client.log_text, self.run_id, text, artifact_file)

    def end(self, status: str) -> None:
        """Mark the run ended: FINISHED, FAILED or KILLED."""
        retry(self._client.set_terminated, self.run_id, status)

    # -- models ----------------------------------------------------------------------------------------------------

    def log_model(self, model: torch.nn.Module, name: str, input_example: Any,
                  registered_model_name: str | None = None, model_dir: str | os.PathLike | None = None,
                  raw_example: dict[str, list[Any]] | None = None, tensor_model: bool = False) -> str | None:
        """Log a model (``name=``, MLflow 3) with an input example; register it when asked and allowed.

        With `model_dir` (the folder a training stage wrote, with its preprocessing.json) and `raw_example` (a
        few raw inputs): an MLflow pyfunc on raw inputs (trainlab.serving), whose artifacts hold the folder and,
        with `tensor_model` (``tracking.log_tensor_model``), the tensor-level model. Without them (a spool written
        before raw-input models): the tensor-level torch model alone. The tensor-level model is saved in MLflow's
        safe 'pt2' format (torch.export of a CPU, eval-mode copy: about 1 s for the default models on a 2-core CPU,
        hence off by default); a model that cannot be exported falls back to 'pickle' with a warning. Pip
        requirements are pinned from the installed packages (no inference subprocess, no network). Returns the
        registered version, or None when not registered (no name given, or ``tracking.register_models`` is false).
        """
        check_model_call(name, input_example)
        example = _example_array(input_example)
        raw_inputs = model_dir is not None and raw_example is not None and (Path(model_dir) /
                                                                            "preprocessing.json").is_file()
        exported = tensor_model or not raw_inputs  # the tensor-level model is logged: torch.export of a CPU copy
        export_model, restore = exportable(model) if exported else (None, lambda: None)
        try:
            with global_tracking_uri(self.tracking_uri), warnings.catch_warnings():
                # torch.export.save says this for channels_last weights; harmless for a CPU model.
                warnings.filterwarnings("ignore", message="No complete tensor found in the group",
                                        category=UserWarning)
                if raw_inputs:
                    info = self._log_pyfunc(export_model, name, example, Path(model_dir), raw_example)
                else:
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

        run_params = retry(self._client.get_run, self.run_id).data.params
        # Create the LoggedModel explicitly: without an active fluent run, log_model(run_id=...) alone would file
        # the model under the Default experiment ('0') and its ./mlruns artifact root.
        logged = retry(mlflow.initialize_logged_model, name=name, source_run_id=self.run_id,
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

    def _log_pyfunc(self, model: Any | None, name: str, example: Any, model_dir: Path,
                    raw_example: dict[str, list[Any]]) -> Any:
        """The pyfunc on raw inputs (trainlab/serving/pyfunc_model.py, "models from code") with the model folder,
        the tensor-level model when `model` is given, trainlab's code, a signature and a raw input example."""
        import mlflow
        import mlflow.pyfunc
        from mlflow.models import Model

        with tempfile.TemporaryDirectory(prefix="trainlab-model-") as tmp:
            tensor_model = Path(tmp) / flavor.TENSOR_ARTIFACT if model is not None else None
            if tensor_model is not None:
                _save_tensor_model(model, tensor_model, example, name)
            run_params = retry(self._client.get_run, self.run_id).data.params
            logged = retry(mlflow.initialize_logged_model, name=name, source_run_id=self.run_id,
                            experiment_id=self.experiment_id, params=run_params)
            try:
                # MLflow loads the model here and predicts the example as its server would (a failure is a warning)
                return Model.log(artifact_path=None, name=name, flavor=mlflow.pyfunc, run_id=self.run_id,
                                 model_id=logged.model_id,
                                 **flavor.pyfunc_arguments(model_dir, tensor_model, raw_example))
            except Exception:
                try:
                    self._client.delete_logged_model(logged.model_id)
                except Exception:  # noqa: BLE001 - best-effort cleanup of the empty model entry
                    pass
                raise

    def _register(self, model_id: str, registered_model_name: str) -> str:
        """Register ``models:/<model_id>`` as a new version (quietly, race-safely) and link it on the model; the
        model's first version becomes its champion."""
        from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS

        try:
            retry(self._client.create_registered_model, registered_model_name)
        except Exception as exc:
            if not already_exists(exc):
                raise
        # The SQL registry resolves `models:/<id>` with MlflowClient(): the global tracking URI (an MLflow TODO).
        with global_tracking_uri(self.tracking_uri):
            version = retry(self._client.create_model_version, name=registered_model_name,
                             source=f"models:/{model_id}", run_id=self.run_id, model_id=model_id)
        crown_if_none(self._client, registered_model_name, str(version.version))
        try:
            logged = self._client.get_logged_model(model_id)
            links = json.loads(logged.tags.get(MLFLOW_MODEL_VERSIONS, "[]"))
            links.append({"name": version.name, "version": version.version})
            retry(self._client.set_logged_model_tags, model_id, {MLFLOW_MODEL_VERSIONS: json.dumps(links)})
        except Exception as exc:  # noqa: BLE001 - the version exists; the UI link is a nicety
            warnings.warn(f"registered {registered_model_name} v{version.version} but could not link it on "
                          f"the logged model: {exc}", RuntimeWarning, stacklevel=3)
        return str(version.version)


def prepare_model_logging() -> None:
    """Build, once per process, the map of installed distributions to modules that MLflow's check of a model's pinned
    requirements reads (in Model.log): about 1.3 s on a 2-core CPU, so a stage's queue thread does it while training
    runs rather than after it. Best effort: the check builds it itself if this could not."""
    try:
        from mlflow.utils import requirements_utils

        requirements_utils._init_modules_to_packages_map()  # MLflow's own cache (a private helper: hence the try)
    except Exception:  # noqa: BLE001 - only a head start; logging the model works without it
        pass


def _save_tensor_model(model: Any, path: Path, example: Any, name: str) -> None:
    """The tensor-level MLflow torch model in `path`: 'pt2' (torch.export), or 'pickle' with a warning when the model
    cannot be exported."""
    import mlflow.pytorch

    requirements = mlflow.pytorch.get_default_pip_requirements()
    try:
        mlflow.pytorch.save_model(model, str(path), input_example=example, serialization_format="pt2",
                                  pip_requirements=requirements)
    except Exception as exc:
        if not _raised_by_torch_export(exc):
            raise
        shutil.rmtree(path, ignore_errors=True)
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        print(f"warning: torch.export could not trace model {name!r} ({type(exc).__name__}: {first_line}); "
              "saving its tensor-level model in MLflow's pickle format instead", file=sys.stderr)
        mlflow.pytorch.save_model(model, str(path), input_example=example, serialization_format="pickle",
                                  pip_requirements=requirements)


def _raised_by_torch_export(exc: BaseException) -> bool:
    """True when the error came out of torch.export tracing (not from MLflow, the store or the network)."""
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


def exportable(model: torch.nn.Module) -> tuple[torch.nn.Module, Callable[[], None]]:
    """An eval-mode CPU model to export (a copy if it lives elsewhere), and how to restore the original's mode."""
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
