"""The table of architectures of each task: a name (the value of `<task>.arch` in params.yaml) -> the module that
builds it and the params model of its own knobs. Light on purpose (no torch): params.yaml is validated against it
before anything heavy loads; an architecture's module is imported only when a model of it is built."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from trainlab.core.section import Section


class ResNetSmallParams(Section):
    """resnet_small: a compact residual CNN for small images (trainlab.models.resnet_small)."""

    width: int = Field(48, ge=4, le=512)
    stem_pool: Annotated[int, Field(ge=1, le=8)] | Literal["auto"] = Field(
        "auto", description="max-pool the stem's output by this factor (1: none), so that the residual stages run at "
        "a lower resolution; auto: 4 for images of 64 px a side and more, else 2")
    stem_pool_first: bool = Field(True, description="max-pool the stem conv's output before its BatchNorm and ReLU "
                                  "(a quarter of their work at full resolution); false: after")


class UNetParams(Section):
    """unet: a U-Net (trainlab.models.unet)."""

    base_channels: int = Field(16, ge=4, le=256)
    depth: int = Field(3, ge=1, le=6)
    depthwise_separable: bool = False
    full_res_convs: int = Field(1, ge=1, le=2, description="3x3 convs in the two full-resolution blocks (the "
                                "encoder's first, the decoder's last): 2 as in U-Net, 1 for less compute there")
    skip_merge: Literal["concat", "add"] = Field("add", description="how the decoder merges the encoder's skip "
                                                 "below full resolution: concat (U-Net) or add (half the input "
                                                 "channels of those decoder blocks); full resolution always concats")


class TransformerParams(Section):
    """transformer: a pre-norm Transformer encoder over token ids (trainlab.models.transformer)."""

    d_model: int = Field(128, ge=8, le=4096)
    n_heads: int = Field(4, ge=1, le=64)
    n_layers: int = Field(2, ge=1, le=48)
    dim_feedforward: int = Field(256, ge=8)
    dropout: float = Field(0.0, ge=0, lt=1)
    pooling: Literal["mean", "cls"] = "mean"
    embedding_dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the token embeddings")

    @field_validator("n_heads")
    @classmethod
    def _heads_divide_width(cls, n_heads: int, info) -> int:
        d_model = info.data.get("d_model")
        if d_model is not None and d_model % n_heads:
            raise ValueError(f"must divide text.d_model ({d_model})")
        return n_heads


class NgramBagParams(Section):
    """ngram_bag and nb_bag: bags of words and hashed word n-grams (trainlab.models.ngram_bag)."""

    d_model: int = Field(128, ge=8, le=4096)
    dropout: float = Field(0.0, ge=0, lt=1)
    ngrams: int = Field(2, ge=1, le=3, description="words and their 2..ngrams-grams")
    buckets: int = Field(65536, ge=1, le=2**24, description="hash buckets for the n-grams")


class TfidfBagParams(NgramBagParams):
    """tfidf_bag: TF-IDF weighted word and character n-grams under a linear head (trainlab.models.tfidf_bag)."""

    char_ngrams: tuple[int, int] | None = Field((3, 5), description="[low, high] characters of the n-grams of each "
                                                "word, or null for none")
    char_buckets: int = Field(65536, ge=1, le=2**24, description="hash buckets for character n-grams")

    @field_validator("char_ngrams")
    @classmethod
    def _char_range(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is not None and not 1 <= value[0] <= value[1] <= 8:
            raise ValueError(f"must be [low, high] with 1 <= low <= high <= 8, got {list(value)}")
        return value


@dataclass(frozen=True)
class Arch:
    """An architecture: `module` defines `builder(p, **sizes)` -> an nn.Module with a `config` dict (and, for a
    classifier, a `head`); `params`: the params model of its own knobs (their keys sit in the task's section)."""

    module: str
    params: type[Section] = Section
    builder: str = "build"

    def build(self, p: Any, **sizes: Any) -> Any:
        return getattr(importlib.import_module(self.module), self.builder)(p, **sizes)


CLASSIFIER_ARCHS: dict[str, Arch] = {
    "resnet_small": Arch("trainlab.models.resnet_small", ResNetSmallParams),
    "resnet18": Arch("trainlab.models.torchvision_nets"),
    "mobilenet_v3_small": Arch("trainlab.models.torchvision_nets"),
    "efficientnet_b0": Arch("trainlab.models.torchvision_nets"),
}
SEGMENTER_ARCHS: dict[str, Arch] = {
    "unet": Arch("trainlab.models.unet", UNetParams),
}
TEXT_ARCHS: dict[str, Arch] = {
    "tfidf_bag": Arch("trainlab.models.tfidf_bag", TfidfBagParams),
    "transformer": Arch("trainlab.models.transformer", TransformerParams),
    "ngram_bag": Arch("trainlab.models.ngram_bag", NgramBagParams),
    "nb_bag": Arch("trainlab.models.ngram_bag", NgramBagParams, builder="build_nb"),
}
TABLES = {"classifier": CLASSIFIER_ARCHS, "segmenter": SEGMENTER_ARCHS, "text": TEXT_ARCHS}


def knobs(table: dict[str, Arch]) -> list[type[Section]]:
    """The params models of a table's architectures, each once, most specific first (the bases of the section)."""
    models: list[type[Section]] = []
    for arch in table.values():
        if arch.params is not Section and arch.params not in models:
            models.append(arch.params)
    return sorted(models, key=lambda m: -len(m.__mro__))


def build(task: str, p: Any, **sizes: Any) -> Any:
    """The model of `p.arch` from the task's table, for data of these sizes (the section's autos that shape a model
    resolved first: trainlab.core.auto). A builder that sets no `config` gets one: the task, the arch, its own knobs
    (its params model's fields) and the sizes, what config.json saves and rebuilds the network from."""
    from trainlab.core.auto import resolve_model

    p, _ = resolve_model(task, p)
    arch = TABLES[task][p.arch]
    model = arch.build(p, **sizes)
    if not hasattr(model, "config"):
        model.config = {"task": task, "arch": p.arch, **{k: getattr(p, k) for k in arch.params.model_fields}, **sizes}
    return model
