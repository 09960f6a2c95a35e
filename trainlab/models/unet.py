"""unet: a U-Net segmenter: conv encoder, transposed-conv decoder with skip connections, per-pixel class logits."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trainlab.models.checkpointing import checkpoint_block
from trainlab.models.init import init_weights


def conv_bn_relu(cin: int, cout: int, depthwise: bool) -> list[nn.Module]:
    """A 3x3 conv (or depthwise 3x3 + pointwise 1x1), BatchNorm and ReLU."""
    if depthwise:
        convs = [nn.Conv2d(cin, cin, 3, padding=1, groups=cin, bias=False), nn.Conv2d(cin, cout, 1, bias=False)]
    else:
        convs = [nn.Conv2d(cin, cout, 3, padding=1, bias=False)]
    return [*convs, nn.BatchNorm2d(cout), nn.ReLU()]


class ConvBlock(nn.Sequential):
    """Two conv-BN-ReLU layers, the U-Net building block (or one: `convs=1`)."""

    def __init__(self, cin: int, cout: int, depthwise: bool = False, convs: int = 2):
        second = conv_bn_relu(cout, cout, depthwise) if convs > 1 else []
        super().__init__(*conv_bn_relu(cin, cout, depthwise), *second)


class UNet(nn.Module):
    """U-Net with `depth` 2x downsamplings; widths base, 2*base, ..., base * 2**depth at the bottleneck. The two
    blocks at full resolution (the encoder's first, the decoder's last) have `full_res_convs` convs, the others two.
    `skip_merge` "add" adds the encoder's skip to the upsampled features below full resolution instead of
    concatenating them; the full-resolution skip, which carries the finest detail, is always concatenated."""

    def __init__(self, num_classes: int, in_channels: int, base_channels: int = 16, depth: int = 3,
                 depthwise_separable: bool = False, checkpointing: bool = False, inference_tile: int | None = None,
                 full_res_convs: int = 2, skip_merge: str = "concat"):
        super().__init__()
        self.depth, self.checkpointing, self.inference_tile = depth, checkpointing, inference_tile
        levels = range(depth - 1, -1, -1)  # the decoder's, bottom to top
        self.adds = [skip_merge == "add" and i > 0 for i in levels]
        widths = [base_channels * 2**i for i in range(depth + 1)]
        dw = depthwise_separable
        self.encoder = nn.ModuleList(
            [ConvBlock(in_channels, widths[0], dw, full_res_convs)]
            + [ConvBlock(widths[i], widths[i + 1], dw) for i in range(depth)]
        )
        self.pool = nn.MaxPool2d(2)
        self.up = nn.ModuleList(nn.ConvTranspose2d(widths[i + 1], widths[i], 2, stride=2) for i in levels)
        self.decoder = nn.ModuleList(ConvBlock((1 if add else 2) * widths[i], widths[i], dw,
                                               full_res_convs if i == 0 else 2)
                                     for i, add in zip(levels, self.adds))
        self.head = nn.Conv2d(widths[0], num_classes, 1)

    def forward(self, x):
        tile = self.inference_tile
        if tile and not self.training and max(x.shape[-2:]) > tile:
            return self.tiled(x, tile)
        return self.whole(x)

    def tiled(self, x: torch.Tensor, tile: int) -> torch.Tensor:
        """Sliding-window prediction: overlapping tiles (a quarter of a tile apart at least), logits averaged where
        tiles overlap, so that tile borders leave no seams; tile positions depend only on the image size."""
        h, w = x.shape[-2:]
        stride = max(1, tile - tile // 4)
        logits = counts = None
        for top in window_starts(h, tile, stride):
            for left in window_starts(w, tile, stride):
                part = self.whole(x[..., top:top + tile, left:left + tile])
                if logits is None:
                    logits = part.new_zeros((*part.shape[:2], h, w))
                    counts = part.new_zeros((1, 1, h, w))
                logits[..., top:top + tile, left:left + tile] += part
                counts[..., top:top + tile, left:left + tile] += 1
        return logits / counts

    def whole(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        multiple = 2**self.depth
        if h % multiple or w % multiple:  # pad to a multiple of 2**depth, crop the logits back
            x = F.pad(x, (0, -w % multiple, 0, -h % multiple))
        skips = []
        for i, block in enumerate(self.encoder):
            x = checkpoint_block(block, x if i == 0 else self.pool(x), enabled=self.checkpointing)
            skips.append(x)
        skips.pop()  # the bottleneck output is x itself
        for up, block, add in zip(self.up, self.decoder, self.adds):
            x = skips.pop() + up(x) if add else torch.cat([skips.pop(), up(x)], 1)
            x = checkpoint_block(block, x, enabled=self.checkpointing)
        return self.head(x)[..., :h, :w]


def window_starts(size: int, tile: int, stride: int) -> list[int]:
    """Start offsets of windows of `tile` covering 0..size, `stride` apart, the last one flush with the end."""
    if size <= tile:
        return [0]
    starts = list(range(0, size - tile, stride))
    return [*starts, size - tile]


def build(p, num_classes: int, in_channels: int) -> nn.Module:
    """A U-Net giving (N, num_classes, H, W) logits for (N, in_channels, H, W) images (inference_tile resolved by
    the data's image size before building; None predicts whole images)."""
    tile = p.inference_tile if isinstance(p.inference_tile, int) else None
    model = UNet(num_classes, in_channels, p.base_channels, p.depth, p.depthwise_separable, p.activation_checkpointing,
                 tile, p.full_res_convs, p.skip_merge)
    init_weights(model, p.init)
    model.config = {
        "task": "segmenter", "arch": "unet", "base_channels": p.base_channels, "depth": p.depth,
        "depthwise_separable": p.depthwise_separable, "full_res_convs": p.full_res_convs,
        "skip_merge": p.skip_merge, "num_classes": num_classes,
        "in_channels": in_channels, "inference_tile": tile,
    }
    return model
