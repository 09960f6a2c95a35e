"""torchvision's classifiers (resnet18, mobilenet_v3_small, efficientnet_b0) with a fresh linear `head`."""

from __future__ import annotations

import torch
from torch import nn

from trainlab.models.checkpointing import checkpoint_block
from trainlab.models.init import init_weights
from trainlab.models.weights import load_weights


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


def build(p, num_classes: int, in_channels: int) -> TorchvisionClassifier:
    """torchvision's `p.arch` (resnet18, mobilenet_v3_small, efficientnet_b0) with a fresh head for these classes."""
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
