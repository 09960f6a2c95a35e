"""resnet_small: a compact residual CNN for small images (28x28 and up), the classifier's default architecture."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trainlab.models.checkpointing import checkpoint_block
from trainlab.models.init import init_weights
from trainlab.models.weights import load_weights


class StridedPointwise(nn.Conv2d):
    """A 1x1 convolution with a stride, computed as the 1x1 convolution of every stride-th pixel: the same numbers
    (bitwise, forward and gradients), and it avoids a crash in torch 2.14.1's CPU kernel for a strided 1x1
    convolution of fewer than 16 input channels in channels_last (heap corruption in its weight gradient, seen on a
    2-core AMD EPYC Zen 4: widths 4, 8 and 12 at 64-256 px)."""

    def forward(self, x):
        return F.conv2d(x[:, :, ::self.stride[0], ::self.stride[1]], self.weight, self.bias)


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers plus a shortcut (a strided 1x1 conv-BN when the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(StridedPointwise(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNetSmall(nn.Module):
    """A compact ResNet for 28x28-and-up images: 3x3 stem (then a `stem_pool` x `stem_pool` max-pool), stages of
    width w, 2w, 4w, global pool, linear head. `stem_pool_first` max-pools the stem conv's output before its
    BatchNorm and ReLU (as airbench's blocks do), not after them."""

    def __init__(self, num_classes: int, in_channels: int, width: int = 32, checkpointing: bool = False,
                 stem_pool: int = 1, stem_pool_first: bool = False):
        super().__init__()
        self.checkpointing = checkpointing
        pool = [nn.MaxPool2d(stem_pool)] if stem_pool > 1 else []
        norm = [nn.BatchNorm2d(width), nn.ReLU()]
        conv = nn.Conv2d(in_channels, width, 3, 1, 1, bias=False)
        self.stem = nn.Sequential(conv, *(pool + norm if stem_pool_first else norm + pool))
        self.blocks = nn.ModuleList(
            [BasicBlock(width, width), BasicBlock(width, 2 * width, 2), BasicBlock(2 * width, 4 * width, 2)]
        )
        self.head = nn.Linear(4 * width, num_classes)

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = checkpoint_block(block, x, enabled=self.checkpointing)
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def build(p, num_classes: int, in_channels: int) -> nn.Module:
    """The network for classifier section `p` (its width, stem_pool and stem_pool_first; a pretrained file's weights
    but a fresh head)."""
    net = ResNetSmall(num_classes, in_channels, p.width, p.activation_checkpointing, p.stem_pool, p.stem_pool_first)
    model = init_weights(net, p.init)
    if p.pretrained:
        load_weights(model, p.pretrained, fresh_prefix="head.")
    return model
