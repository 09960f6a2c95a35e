"""Optimizer and LR schedule: no weight decay on biases and norm weights, a separate head LR, warmup + cosine."""

from __future__ import annotations

import math

import torch
from torch import nn

from trainlab.config import TrainParams


def param_groups(model: nn.Module, weight_decay: float, lr: float, head: nn.Module | None = None,
                 head_lr: float | None = None) -> list[dict]:
    """Split trainable parameters into decay / no-decay groups (1-D tensors: biases, norm weights), with the head
    in its own groups when it has its own learning rate."""
    head_ids = {id(p) for p in head.parameters()} if head is not None and head_lr is not None else set()
    groups: dict[tuple[bool, bool], list[nn.Parameter]] = {}
    for p in model.parameters():
        if not p.requires_grad:
            continue
        key = (id(p) in head_ids, p.ndim > 1)
        groups.setdefault(key, []).append(p)
    out = []
    for (is_head, decays), params in sorted(groups.items()):
        out.append({"params": params, "weight_decay": weight_decay if decays else 0.0,
                    "lr": head_lr if is_head else lr, "name": f"{'head' if is_head else 'body'}_{'decay' if decays else 'no_decay'}"})
    return out


def build_optimizer(groups: list[dict], cfg: TrainParams, device: torch.device) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=0.9, nesterov=True)
    # fused kernels are deterministic and fast on CUDA; foreach elsewhere.
    fused = device.type == "cuda"
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), fused=fused, foreach=None if fused else True)


def warmup_cosine(total_steps: int, warmup_steps: int, schedule: str, min_ratio: float = 0.01):
    """LR multiplier per optimizer step: linear warmup, then cosine decay to `min_ratio` (or constant)."""

    def factor(step: int) -> float:
        if warmup_steps and step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def build_scheduler(optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int, schedule: str):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(total_steps, warmup_steps, schedule))
