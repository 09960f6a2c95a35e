"""The training sections of params.yaml (classifier, segmenter, text): what the engine reads, plus each task's
architectures' own knobs, composed from the task's table (trainlab.models.architectures)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from trainlab.core.section import Section
from trainlab.models.architectures import CLASSIFIER_ARCHS, SEGMENTER_ARCHS, TEXT_ARCHS, knobs

InitScheme = Literal["default", "kaiming", "xavier", "orthogonal", "normal"]
# The types of the training keys whose default differs per section: each section restates its default with the same
# type and range (params.yaml's value; tests/core/test_defaults.py holds the two equal)
Epochs = Annotated[int, Field(ge=1, le=10_000)] | Literal["auto"]
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
    # epochs auto's lower bound in optimizer steps (at most LOWER_EPOCHS epochs), so that a small data set is not
    # stopped on noise (trainlab.core.auto; null: one epoch); a number of epochs is trained exactly
    min_steps: MinSteps = None
    batch_size: BatchSize = 128
    optimizer: Optimizer = "adamw"
    lr: LearningRate = 1e-3
    weight_decay: WeightDecay = 0.0
    warmup_epochs: WarmupEpochs = 0.0
    # cosine (warmup, then cosine decay over the epochs) | constant | plateau (constant until the validation metric
    # has not improved for `patience` validations, then a linear cooldown; what epochs auto trains with)
    schedule: Literal["cosine", "constant", "plateau"] = "cosine"
    # epochs auto (and schedule plateau): validations without a primary validation metric better than the best by
    # more than its standard error on the validation split (trainlab.engine.stopping) before the cooldown
    patience: int = Field(3, ge=1, le=1000)
    # schedule plateau: the weights kept, the best validation's or the last (after the cooldown)
    keep: Literal["last", "best"] = "last"
    # optimizer steps between validations (a number is honoured, within an epoch too); auto: every epoch, or every few
    # epochs so that the lower bound of a run (min_steps, or the epochs set) holds about 20 validations
    # (trainlab.core.auto)
    validate_every: Annotated[int, Field(ge=1)] | Literal["auto"] = "auto"
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


class ClassifierParams(TrainParams, *knobs(CLASSIFIER_ARCHS)):
    init: InitScheme = "kaiming"
    epochs: Epochs = "auto"
    # auto: 480, and 8x that with CutMix (trainlab.core.auto: mixed images train longer)
    min_steps: MinSteps | Literal["auto"] = "auto"
    batch_size: BatchSize = 64
    lr: LearningRate = 0.003
    weight_decay: WeightDecay = 0.05
    warmup_epochs: WarmupEpochs = 1.0
    label_smoothing: LabelSmoothing = 0.05
    arch: Literal[tuple(CLASSIFIER_ARCHS)] = "resnet_small"  # trainlab.models.architectures
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


class SegmenterParams(TrainParams, *knobs(SEGMENTER_ARCHS)):
    init: InitScheme = "kaiming"
    epochs: Epochs = "auto"
    min_steps: MinSteps = 600
    batch_size: BatchSize = 32
    lr: LearningRate = 0.006
    weight_decay: WeightDecay = 0.01
    warmup_epochs: WarmupEpochs = 1.0
    arch: Literal[tuple(SEGMENTER_ARCHS)] = "unet"  # trainlab.models.architectures
    dice_weight: float = Field(0.5, ge=0, le=10)
    # auto: crops of AUTO_CROP (trainlab.core.auto) where the stored images are more than twice that a side,
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


class TextParams(TrainParams, *knobs(TEXT_ARCHS)):
    init: InitScheme = "xavier"
    epochs: Epochs = "auto"
    min_steps: MinSteps = 400
    optimizer: Optimizer = "sgd"  # with weight_decay as L2: the TF-IDF bag's logistic-regression objective
    lr: LearningRate = 3.0
    augment: bool = False
    arch: Literal[tuple(TEXT_ARCHS)] = "tfidf_bag"  # trainlab.models.architectures
    # auto: tfidf_bag trains one head per candidate (trainlab.core.auto.WEIGHT_DECAY_CANDIDATES) and keeps the one
    # the validation split chooses (a list of values does the same with those); other archs take their documented value
    weight_decay: float | Literal["auto"] | tuple[float, ...] = "auto"  # (a plain float: searchable as a float range)
    baseline_max_features: int = Field(50000, ge=10)
    baseline_C: float = Field(1.0, gt=0)

    @property
    def optimizer_weight_decay(self) -> float:
        from trainlab.core.auto import text_model

        decay = text_model(self, {})[0].get("weight_decay", self.weight_decay)
        return 0.0 if isinstance(decay, tuple) else decay  # candidates: each head carries its own L2

    @field_validator("weight_decay")
    @classmethod
    def _decay_range(cls, value: Any) -> Any:
        values = value if isinstance(value, tuple) else () if isinstance(value, str) else (value,)
        if not all(0 <= v <= 1 for v in values) or value == ():
            raise ValueError(f"must be a number from 0 to 1, a list of them, or auto; got {value}")
        return value
