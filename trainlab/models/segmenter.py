"""The image segmenter of `segmenter.arch`, from its task's table (trainlab.models.architectures)."""

from __future__ import annotations

from torch import nn

from trainlab.models import architectures
from trainlab.models.unet import ConvBlock, UNet, conv_bn_relu, window_starts  # noqa: F401 - re-exported


def build_segmenter(p, num_classes: int, in_channels: int) -> nn.Module:
    """The segmenter `p.arch` (section `p`) for `in_channels`-channel images and `num_classes` classes."""
    return architectures.build("segmenter", p, num_classes=num_classes, in_channels=in_channels)
