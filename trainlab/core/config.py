"""params.yaml loaded once into typed, validated pydantic models; errors name the key path, line and allowed values."""

from __future__ import annotations

import difflib
import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator

from trainlab.core.errors import ParamsError
from trainlab.core.section import Section
from trainlab.core.training_params import (  # noqa: F401 - the training sections, imported from here by most code
    ClassifierParams,
    SegmenterParams,
    TextParams,
    TrainParams,
)

DEFAULT_PARAMS = Path("params.yaml")


class DistributedParams(Section):
    """How training stages launch: >1 process re-runs the stage under torchrun (gloo on CPU, nccl on CUDA)."""

    nproc_per_node: int = Field(1, ge=1, le=1024)
    nnodes: int = Field(1, ge=1, le=4096)
    node_rank: int = Field(0, ge=0)
    rdzv_endpoint: str = "127.0.0.1:29500"
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    sync_batchnorm: bool = False


class BaseParams(Section):
    seed: int = Field(42, ge=0, le=2**31 - 1)
    deterministic: bool = True
    device: Literal["auto", "cpu", "cuda", "mps"] = "auto"
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    compile: bool = False
    cuda_graphs: bool | Literal["auto"] = "auto"
    channels_last: bool = True
    tf32: bool = True
    data_on_device_max_mb: int = Field(2048, ge=0)
    num_workers: int = Field(2, ge=0, le=64)
    distributed: DistributedParams = DistributedParams()


ImageSize = Annotated[int, Field(ge=8, le=2048)] | Literal["auto"]


class ClassificationData(Section):
    source: Literal["embedded", "mnist", "fashion_mnist", "cifar10", "image_folder"] = "embedded"
    root: str = "data/raw/classification"
    # image_folder: stored images are image_size x image_size: shorter side resized to it, then the centre square;
    # auto keeps images that all share one size up to 96 px a side, else 96 (photos; trainlab.data.folders)
    image_size: ImageSize = "auto"
    # a mirror keeps the label (augmentation and TTA): auto is true for photos (colour image folders of varied or
    # large sizes), fashion_mnist and cifar10; false for digits and gray or small one-size folders
    hflip: bool | Literal["auto"] = "auto"


class SegmentationData(Section):
    source: Literal["embedded", "paired_folders"] = "embedded"
    root: str = "data/raw/segmentation"
    canvas_size: int = Field(48, ge=28, le=512)
    max_digits: int = Field(3, ge=1, le=8)
    canvases_per_digit: float = Field(1.0, gt=0, le=20)
    num_classes: int = Field(11, ge=2, le=256)
    # label-preserving transforms of the user's images, for augmentation (recorded in meta.json): none; flips
    # (horizontal and vertical); dihedral (flips and 90-degree rotations). The embedded digit canvases allow none.
    symmetries: Literal["none", "flips", "dihedral"] = "none"
    # paired_folders: images (and masks, by nearest neighbour) stretched to image_size x image_size; auto keeps
    # the images' own resolution when they share one size (up to 1024 px a side), else the median side
    image_size: ImageSize = "auto"


class TextData(Section):
    source: Literal["embedded", "csv"] = "embedded"
    path: str = "data/raw/text/texts.csv"
    text_column: str = "text"
    label_column: str = "label"
    delimiter: str = Field(",", min_length=1, max_length=1)
    vocab_size: int = Field(8000, ge=16, le=1_000_000)
    min_frequency: int = Field(2, ge=1)
    # tokens kept per text ([CLS] included); auto: the 99th percentile of the training split's lengths, rounded up to
    # a multiple of 8, at most 512 (trainlab.data.tokenizer.auto_max_length), resolved and recorded by prepare
    max_length: Annotated[int, Field(ge=4, le=4096)] | Literal["auto"] = "auto"
    lowercase: bool = True
    oov_buckets: int = Field(0, ge=0, le=1_000_000, description="hash words outside the vocabulary into this many ids")


class DataParams(Section):
    val_fraction: float = Field(0.1, gt=0, lt=0.5)
    test_fraction: float = Field(0.2, gt=0, lt=0.5)
    # unreadable image files: error (prepare stops, naming them) | skip (left out, listed in reports/data_stats.json)
    bad_images: Literal["error", "skip"] = "error"
    classification: ClassificationData = ClassificationData()
    segmentation: SegmentationData = SegmentationData()
    text: TextData = TextData()


class EvaluateParams(Section):
    batch_size: int = Field(256, ge=1)
    tta: bool = False
    n_examples: int = Field(16, ge=1, le=256)


class ProfileParams(Section):
    batch_size: int = Field(64, ge=1)
    warmup_steps: int = Field(2, ge=0)
    steps: int = Field(3, ge=1)
    repeats: int = Field(3, ge=1)
    compile: bool = False
    trace: bool = True
    # used: the training stages' setting and the plain fp32 baseline; all: every precision x memory layout
    settings: Literal["used", "all"] = "used"


class TrackingParams(Section):
    enabled: bool = True
    uri: str | None = None
    experiment: str = Field("trainlab", min_length=1)
    register_models: bool = True
    log_tensor_model: bool = False  # also torch.export the bare network into the logged model (about 1 s more)
    fallback_to_local: bool = False
    connect_timeout_s: float = Field(5, gt=0, le=120)
    # Each MLflow HTTP request (MLFLOW_HTTP_REQUEST_TIMEOUT / _MAX_RETRIES); calls that still fail stay queued
    # and are retried in the background until the server answers again.
    request_timeout_s: int = Field(10, ge=1, le=600)
    request_retries: int = Field(1, ge=0, le=10)
    outage_grace_s: float = Field(300, ge=0, le=86400)
    queue_size: int = Field(10000, ge=10, le=1_000_000)


class ScheduleParams(Section):
    cron: str = "0 3 * * *"
    timezone: str = "UTC"

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, cron: str) -> str:
        from datetime import datetime

        from cronsim import CronSim, CronSimError

        try:
            CronSim(cron, datetime(2026, 1, 1))
        except CronSimError as exc:
            raise ValueError(f"not a valid cron expression ({exc})") from None
        return cron

    @field_validator("timezone")
    @classmethod
    def _valid_timezone(cls, tz: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError("not a known IANA time zone (for example UTC, Europe/Berlin)") from None
        return tz


class Params(Section):
    base: BaseParams = BaseParams()
    data: DataParams = DataParams()
    classifier: ClassifierParams = ClassifierParams()
    segmenter: SegmenterParams = SegmenterParams()
    text: TextParams = TextParams()
    evaluate: EvaluateParams = EvaluateParams()
    profile: ProfileParams = ProfileParams()
    tracking: TrackingParams = TrackingParams()
    schedule: ScheduleParams = ScheduleParams()

    def section_hash(self, *sections: str) -> str:
        """A short stable hash of the named sections (all when none are named)."""
        data = self.model_dump(mode="json", include=set(sections) or None)
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


def load_params(path: str | Path = DEFAULT_PARAMS, overrides: dict[str, Any] | None = None) -> Params:
    """Read and validate a params file; `overrides` maps dotted keys (``classifier.lr``) to values."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ParamsError(f"{path}: params file not found") from None
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ParamsError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ParamsError(f"{path}: the top level must be a mapping of sections, got {type(raw).__name__}")
    for dotted, value in (overrides or {}).items():
        _set_dotted(raw, dotted, value)
    try:
        return Params.model_validate(raw)
    except ValidationError as exc:
        raise ParamsError(_describe(exc, path, text)) from None


def _set_dotted(raw: dict, dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = raw
    for key in parents:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ParamsError(f"override {dotted!r}: {key!r} is not a section")
    node[leaf] = value


def _describe(exc: ValidationError, path: Path, text: str) -> str:
    problems: dict[str, tuple[str, list[str]]] = {}  # key -> (where, messages): a union's members are one problem
    for err in exc.errors():
        loc = _key_path([str(p) for p in err["loc"]])
        key = ".".join(loc)
        line = _line_of(text, loc)
        where = f"{path}:{line}" if line else str(path)
        if err["type"] == "extra_forbidden":
            valid = _fields_at(loc[:-1])
            close = difflib.get_close_matches(loc[-1], valid, n=1)
            hint = f"; did you mean {'.'.join(loc[:-1] + close)!r}?" if close else ""
            msg = f"unknown key{hint} Valid keys here: {', '.join(valid)}"
        elif err["type"] == "literal_error":
            msg = f"got {err['input']!r}; {err['msg'].lower()}"
        else:
            msg = f"got {err.get('input')!r}; {err['msg']}"
        where_msgs = problems.setdefault(key, (where, []))[1]
        where_msgs.append(msg if not where_msgs else msg.split("; ", 1)[-1])  # the input named once
    count = len(problems)
    lines = [f"{path}: invalid params ({count} problem{'s' * (count > 1)})"]
    lines += [f"  {key} ({where}): " + "; or ".join(msgs) for key, (where, msgs) in problems.items()]
    return "\n".join(lines)


def _key_path(loc: list[str]) -> list[str]:
    """The params keys of an error location, without what pydantic appends for the member of a union it tried
    (`constrained-int`, `literal['auto']`); an unknown key is kept as the last element."""
    model: type[BaseModel] | None = Params
    keys: list[str] = []
    for part in loc:
        if model is None or part not in model.model_fields:
            if model is not None and not keys[len(keys):] and part.isidentifier():
                keys.append(part)  # an unknown key: named in the error
            break
        keys.append(part)
        annotation = model.model_fields[part].annotation
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    return keys or loc


def _fields_at(loc: list[str]) -> list[str]:
    model: type[BaseModel] = Params
    for key in loc:
        annotation = model.model_fields[key].annotation
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return list(model.model_fields)


def _line_of(text: str, loc: list[str]) -> int | None:
    """The 1-based line of a key path in the YAML text, or of its deepest existing parent."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    line = None
    for key in loc:
        if not isinstance(node, yaml.MappingNode):
            break
        for k, v in node.value:
            if k.value == key:
                line, node = k.start_mark.line + 1, v
                break
        else:
            break
    return line
