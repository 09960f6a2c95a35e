"""Weight initialisation schemes for conv, linear and embedding layers (norm layers reset to identity), and
parameter counts."""

from __future__ import annotations

from torch import nn
from torch.nn.modules.batchnorm import _NormBase
from torch.nn.modules.conv import _ConvNd

SCHEMES = ("default", "kaiming", "xavier", "orthogonal", "normal")
_WEIGHTED = (_ConvNd, nn.Linear, nn.Embedding)
_NORMS = (_NormBase, nn.LayerNorm, nn.GroupNorm, nn.RMSNorm)


def init_weights(model: nn.Module, scheme: str) -> nn.Module:
    """Re-initialise `model` in place with `scheme` and return it; 'default' keeps the framework's init."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown init scheme {scheme!r}; expected one of {', '.join(SCHEMES)}")
    if scheme == "default":
        return model
    for module in model.modules():
        if isinstance(module, _WEIGHTED):
            _init_weight(module.weight, scheme, fan_out=isinstance(module, _ConvNd))
        elif isinstance(module, _NORMS) and getattr(module, "weight", None) is not None:
            nn.init.ones_(module.weight)
        if isinstance(module, _WEIGHTED + _NORMS) and getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)
    return model


def _init_weight(weight, scheme: str, fan_out: bool) -> None:
    if scheme == "kaiming":
        nn.init.kaiming_normal_(weight, mode="fan_out" if fan_out else "fan_in", nonlinearity="relu")
    elif scheme == "xavier":
        nn.init.xavier_uniform_(weight)
    elif scheme == "orthogonal":
        nn.init.orthogonal_(weight)
    else:
        nn.init.normal_(weight, mean=0.0, std=0.02)


def count_parameters(model: nn.Module) -> tuple[int, int]:
    """(total, trainable) parameter counts."""
    params = list(model.parameters())
    return sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad)
