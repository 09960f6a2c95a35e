"""params.yaml loaded once into typed, validated pydantic models; errors name the key path, line and allowed values."""

from __future__ import annotations

import difflib
import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from trainlab.core.errors import ParamsError

DEFAULT_PARAMS = Path("params.yaml")


class Section(BaseModel):
    """A params section: unknown keys are errors, values are checked on assignment too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())


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


InitScheme = Literal["default", "kaiming", "xavier", "orthogonal", "normal"]
# The types of the training keys whose default differs per section: each section restates its default with the same
# type and range (params.yaml's value; tests/core/test_defaults.py holds the two equal)
Epochs = Annotated[int, Field(ge=1, le=10_000)]
MinSteps = Annotated[int | None, Field(ge=1, le=1_000_000)]
BatchSize = Annotated[int, Field(ge=1, le=65536)]
Optimizer = Literal["adamw", "sgd"]
LearningRate = Annotated[float, Field(gt=0, le=10)]
WeightDecay = Annotated[float, Field(ge=0, le=1)]
WarmupEpochs = Annotated[float, Field(ge=0)]
LabelSmoothing = Annotated[float, Field(ge=0, lt=1)]


class TrainParams(Section):
    """Optimisation settings shared by the three training stages (the defaults of a bare engine run; each section
    states its own, params.yaml's)."""

    init: InitScheme = "default"
    epochs: Epochs = 10
    max_steps: int | None = Field(None, ge=1, description="stop after this many optimizer steps")
    # a budget that follows the data: epochs are raised until training takes at least this many optimizer steps, so a
    # data set of 40 images gets as many updates as one of 4,000 (trainlab.tasks.resolve; null: epochs as set)
    min_steps: MinSteps = None
    batch_size: BatchSize = 128
    optimizer: Optimizer = "adamw"
    lr: LearningRate = 1e-3
    weight_decay: WeightDecay = 0.0
    warmup_epochs: WarmupEpochs = 0.0
    schedule: Literal["cosine", "constant"] = "cosine"
    grad_clip: float | None = Field(1.0, gt=0)
    accumulation_steps: int = Field(1, ge=1, le=1024)
    label_smoothing: LabelSmoothing = 0.0
    ema_decay: float | None = Field(None, gt=0, lt=1)
    activation_checkpointing: bool = False
    augment: bool = True
    # recompute BatchNorm statistics from training batches before each validation (Wu and Johnson 2021); auto: when
    # an epoch has fewer than 50 optimizer steps, too few for BatchNorm's running averages to settle (small data).
    # auto for the classifier; off elsewhere (on the segmenter's thin-structure crops it lowered the cell Dice)
    precise_bn: bool | Literal["auto"] = False
    checkpoint_every_steps: int = Field(0, ge=0, description="0: a checkpoint at each epoch end only")

    @property
    def epoch_repeats(self) -> int:
        """Times each training sample is drawn in one epoch (the segmenter's crops per image; else 1)."""
        return 1

    @property
    def augments(self) -> bool:
        """Whether training batches are augmented at all (the classifier's augment is a kind, "none" for off)."""
        return self.augment not in (False, "none")

    @property
    def optimizer_weight_decay(self) -> float:
        """The weight decay the engine's optimizer applies (0 where the model regularises itself)."""
        return self.weight_decay


class ClassifierParams(TrainParams):
    init: InitScheme = "kaiming"
    epochs: Epochs = 9
    # auto: 480, and 8x that with CutMix (trainlab.tasks.resolve.resolve_training: mixed images train longer)
    min_steps: MinSteps | Literal["auto"] = "auto"
    batch_size: BatchSize = 64
    lr: LearningRate = 0.003
    weight_decay: WeightDecay = 0.05
    warmup_epochs: WarmupEpochs = 1.0
    label_smoothing: LabelSmoothing = 0.05
    arch: Literal["resnet_small", "resnet18", "mobilenet_v3_small", "efficientnet_b0"] = "resnet_small"
    width: int = Field(48, ge=4, le=512)
    stem_pool: Annotated[int, Field(ge=1, le=8)] | Literal["auto"] = Field(
        "auto", description="resnet_small: max-pool the stem's output by this factor (1: none), so that the residual "
        "stages run at a lower resolution; auto: 4 for images of 64 px a side and more, else 2")
    stem_pool_first: bool = Field(True, description="resnet_small: max-pool the stem conv's output before its "
                                  "BatchNorm and ReLU (a quarter of their work at full resolution); false: after")
    pretrained: str | None = None
    freeze_backbone: bool = False
    head_lr: float | None = Field(None, gt=0, le=10)
    precise_bn: bool | Literal["auto"] = "auto"
    # shift: 2-pixel shifts (and mirrors where data.classification.hflip allows), for digits, letters, scans and small
    # fixed-size images; photo: torchvision's random resized crops and mirrors, for photos; none. auto: what prepare
    # found the images to be (meta.json "augment": photo for colour images of varied or large sizes, else shift)
    augment: Literal["auto", "shift", "photo", "none"] = "auto"
    # CutMix (Yun et al. 2019) on the training batches; auto: with photo augmentation, as torchvision's recipes mix
    # photos (images of digits, letters or scans are not mixed)
    cutmix: bool | Literal["auto"] = "auto"

    @field_validator("augment", mode="before")
    @classmethod
    def _augment_bool(cls, value: Any) -> Any:
        return {True: "auto", False: "none"}.get(value, value) if isinstance(value, bool) else value


class SegmenterParams(TrainParams):
    init: InitScheme = "kaiming"
    epochs: Epochs = 6
    min_steps: MinSteps = 600
    batch_size: BatchSize = 32
    lr: LearningRate = 0.006
    weight_decay: WeightDecay = 0.01
    warmup_epochs: WarmupEpochs = 1.0
    base_channels: int = Field(16, ge=4, le=256)
    depth: int = Field(3, ge=1, le=6)
    depthwise_separable: bool = False
    full_res_convs: int = Field(1, ge=1, le=2, description="3x3 convs in the two full-resolution blocks (the "
                                "encoder's first, the decoder's last): 2 as in U-Net, 1 for less compute there")
    skip_merge: Literal["concat", "add"] = Field("add", description="how the decoder merges the encoder's skip "
                                                 "below full resolution: concat (U-Net) or add (half the input "
                                                 "channels of those decoder blocks); full resolution always concats")
    dice_weight: float = Field(0.5, ge=0, le=10)
    # auto: crops of AUTO_CROP (trainlab.tasks.resolve) where the stored images are more than twice that a side,
    # else whole images; val and test always see whole images
    crop_size: Annotated[int, Field(ge=8, le=8192)] | None | Literal["auto"] = Field(
        "auto", description="train on random square crops of this size (null: whole images; auto: by image size)")
    # crops of each image in an epoch; auto: the image's area over the crop's (an epoch covers each image about once)
    crops_per_image: Annotated[int, Field(ge=1, le=4096)] | Literal["auto"] = "auto"

    @property
    def epoch_repeats(self) -> int:
        return self.crops_per_image if isinstance(self.crops_per_image, int) and self.crop_size else 1
    inference_tile: Annotated[int, Field(ge=16, le=8192)] | None | Literal["auto"] = Field(
        "auto", description="val/test: predict images larger than this in overlapping tiles of this size (null: "
        "whole images at once; auto: tiles only for images over AUTO_TILE a side)")


# text.weight_decay auto for each text.arch: what the optimizer applies (the transformer's and the bags' documented
# values; the TF-IDF bag's heads regularise themselves)
AUTO_WEIGHT_DECAY = {"transformer": 0.01, "ngram_bag": 0.0, "nb_bag": 0.0, "tfidf_bag": 0.0}


class TextParams(TrainParams):
    init: InitScheme = "xavier"
    min_steps: MinSteps = 400
    optimizer: Optimizer = "sgd"  # with weight_decay as L2: the TF-IDF bag's logistic-regression objective
    lr: LearningRate = 3.0
    augment: bool = False
    arch: Literal["transformer", "ngram_bag", "nb_bag", "tfidf_bag"] = "tfidf_bag"
    # auto: tfidf_bag trains one head per candidate (trainlab.models.tfidf_bag.WEIGHT_DECAY_CANDIDATES) and keeps
    # the one the validation split chooses; the other archs take the value they are documented to want
    weight_decay: float | Literal["auto"] = "auto"  # (a plain float in the union: searchable as a float range)
    d_model: int = Field(128, ge=8, le=4096)
    n_heads: int = Field(4, ge=1, le=64)
    n_layers: int = Field(2, ge=1, le=48)
    dim_feedforward: int = Field(256, ge=8)
    dropout: float = Field(0.0, ge=0, lt=1)
    pooling: Literal["mean", "cls"] = "mean"
    embedding_dropout: float = Field(0.0, ge=0, lt=1, description="transformer: dropout on the token embeddings")
    ngrams: int = Field(2, ge=1, le=3, description="n-gram bags: words and their 2..ngrams-grams")
    buckets: int = Field(65536, ge=1, le=2**24, description="n-gram bags: hash buckets for the n-grams")
    char_ngrams: tuple[int, int] | None = Field((3, 5), description="tfidf_bag: [low, high] characters of the "
                                                "n-grams of each word, or null for none")
    char_buckets: int = Field(65536, ge=1, le=2**24, description="tfidf_bag: hash buckets for character n-grams")
    baseline_max_features: int = Field(50000, ge=10)
    baseline_C: float = Field(1.0, gt=0)

    @property
    def optimizer_weight_decay(self) -> float:
        if self.weight_decay != "auto":
            return self.weight_decay
        return AUTO_WEIGHT_DECAY[self.arch]  # tfidf_bag: 0, its heads carry their own L2

    @field_validator("weight_decay")
    @classmethod
    def _decay_range(cls, value: float | str) -> float | str:
        if value != "auto" and not 0 <= value <= 1:
            raise ValueError(f"must be a number from 0 to 1, or auto; got {value}")
        return value

    @field_validator("n_heads")
    @classmethod
    def _heads_divide_width(cls, n_heads: int, info) -> int:
        d_model = info.data.get("d_model")
        if d_model is not None and d_model % n_heads:
            raise ValueError(f"must divide text.d_model ({d_model})")
        return n_heads

    @field_validator("char_ngrams")
    @classmethod
    def _char_range(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is not None and not 1 <= value[0] <= value[1] <= 8:
            raise ValueError(f"must be [low, high] with 1 <= low <= high <= 8, got {list(value)}")
        return value


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
    lines = [f"{path}: invalid params ({exc.error_count()} problem{'s' * (exc.error_count() > 1)})"]
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
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
        lines.append(f"  {key} ({where}): {msg}")
    return "\n".join(lines)


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
