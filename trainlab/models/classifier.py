"""Image classifiers: a compact residual CNN for small images, and torchvision backbones with a fresh `head`."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from trainlab.core.config import ClassifierParams
from trainlab.core.errors import CheckpointError
from trainlab.models.checkpointing import checkpoint_block
from trainlab.models.init import init_weights


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


class TorchvisionClassifier(nn.Module):
    """A torchvision network whose last linear layer is an Identity, followed by a fresh linear `head`."""

    def __init__(self, backbone: nn.Module, head: nn.Linear, checkpointing: bool = False):
        super().__init__()
        self.backbone, self.head, self.checkpointing = backbone, head, checkpointing

    def forward(self, x):
        return self.head(self.features(x))

    def features(self, x):
        net = self.backbone
        if not (self.checkpointing and self.training and torch.is_grad_enabled()):
            return net(x)
        if type(net).__name__ == "ResNet":  # the torchvision forwards, with each residual block checkpointed
            x = net.maxpool(net.relu(net.bn1(net.conv1(x))))
            blocks, last = [*net.layer1, *net.layer2, *net.layer3, *net.layer4], net.fc
        else:
            blocks, last = net.features, net.classifier
        for block in blocks:
            x = checkpoint_block(block, x, enabled=True)
        return last(torch.flatten(net.avgpool(x), 1))


def build_classifier(p: ClassifierParams, num_classes: int, in_channels: int) -> nn.Module:
    """The classifier `p.arch` for `in_channels`-channel images and `num_classes` classes, with a `head` attribute."""
    # stem_pool auto is resolved against the data before training (ClassifierCode.resolve_auto); a model built
    # without data (a test, a benchmark) takes the small images' 2
    stem_pool = 2 if p.stem_pool == "auto" else p.stem_pool
    if p.arch == "resnet_small":
        net = ResNetSmall(num_classes, in_channels, p.width, p.activation_checkpointing, stem_pool, p.stem_pool_first)
        model = init_weights(net, p.init)
        if p.pretrained:
            load_weights(model, p.pretrained, fresh_prefix="head.")
    else:
        model = _build_torchvision(p, num_classes, in_channels)
    if p.freeze_backbone:
        for param in backbone_parameters(model):
            param.requires_grad_(False)
    model.config = {
        "task": "classifier", "arch": p.arch, "width": p.width, "stem_pool": stem_pool,
        "stem_pool_first": p.stem_pool_first, "num_classes": num_classes,
        "in_channels": in_channels,
    }
    return model


def _build_torchvision(p: ClassifierParams, num_classes: int, in_channels: int) -> TorchvisionClassifier:
    import torchvision.models  # ~1 s of imports: only for these architectures

    net = init_weights(getattr(torchvision.models, p.arch)(weights=None), p.init)
    if p.pretrained:
        load_weights(net, p.pretrained)
    if in_channels != 3:
        name, conv = next((n, m) for n, m in net.named_modules() if isinstance(m, nn.Conv2d))
        net.set_submodule(name, _adapt_conv(conv, in_channels, p.init, keep_weights=bool(p.pretrained)))
    name, last = [(n, m) for n, m in net.named_modules() if isinstance(m, nn.Linear)][-1]
    net.set_submodule(name, nn.Identity())
    head = init_weights(nn.Linear(last.in_features, num_classes), p.init)
    return TorchvisionClassifier(net, head, p.activation_checkpointing)


def _adapt_conv(conv: nn.Conv2d, in_channels: int, init: str, keep_weights: bool) -> nn.Conv2d:
    """A copy of the first conv for `in_channels` inputs; pretrained RGB filters are summed (and spread evenly)."""
    new = nn.Conv2d(
        in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding, bias=conv.bias is not None
    )
    if not keep_weights:
        return init_weights(new, init)
    with torch.no_grad():
        new.weight.copy_(conv.weight.sum(1, keepdim=True).repeat(1, in_channels, 1, 1) / in_channels)
        if conv.bias is not None:
            new.bias.copy_(conv.bias)
    return new


def load_weights(module: nn.Module, path: str | Path, fresh_prefix: str | None = None) -> None:
    """Load a local state_dict file (torch or .safetensors) into `module`, strictly.

    Keys under `fresh_prefix` (a head to be fine-tuned) may be absent or of another shape: they keep their init.
    A missing or unreadable file, or mismatched keys or shapes, raise CheckpointError naming the file.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: pretrained weights file not found")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(path, device="cpu")
        else:
            state = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the user's checkpoint problem
        raise CheckpointError(f"{path}: cannot read a state_dict ({type(exc).__name__}: {exc})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: expected a state_dict (a mapping of names to tensors)")
    own = module.state_dict()
    if fresh_prefix:
        fresh = [k for k in own if k.startswith(fresh_prefix)]
        if any(k not in state or state[k].shape != own[k].shape for k in fresh):
            state = {k: v for k, v in state.items() if not k.startswith(fresh_prefix)}
            own = {k: v for k, v in own.items() if not k.startswith(fresh_prefix)}
    problems = {
        "missing keys": [k for k in own if k not in state],
        "unexpected keys": [k for k in state if k not in own],
        "shape mismatches": [
            f"{k} {tuple(v.shape)} vs {tuple(own[k].shape)}"
            for k, v in state.items()
            if k in own and v.shape != own[k].shape
        ],
    }
    found = [f"{what} ({len(keys)}): " + ", ".join(keys[:5]) + ", ..." * (len(keys) > 5)
             for what, keys in problems.items() if keys]
    if found:
        raise CheckpointError(f"{path}: does not match {type(module).__name__}; " + "; ".join(found))
    module.load_state_dict(state, strict=False)


def backbone_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Every parameter of `model` that is not in `model.head`."""
    head = {id(p) for p in model.head.parameters()}
    return [p for p in model.parameters() if id(p) not in head]
