"""Optimizer and LR schedule: no weight decay on biases and norm weights, a separate head LR, warmup + cosine (or
constant, or constant until a plateau and then a linear cooldown)."""

from __future__ import annotations

import math

import torch
from torch import nn

from trainlab.core.config import TrainParams


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
                    "lr": head_lr if is_head else lr,
                    "name": f"{'head' if is_head else 'body'}_{'decay' if decays else 'no_decay'}"})
    return out


def build_optimizer(groups: list[dict], cfg: TrainParams, device: torch.device,
                    capturable: bool = False) -> torch.optim.Optimizer:
    """AdamW (fused on CUDA, foreach elsewhere) or SGD with Nesterov momentum (fused where torch has the kernel: one
    pass over each weight instead of four, the same weights to rounding). `capturable`: fused AdamW (its step
    count a device tensor) or fused SGD, with the learning rates as device tensors, so that a CUDA graph can replay
    the update (the LR is then set on the device)."""
    if capturable:
        groups = [{**g, "lr": torch.tensor(g.get("lr", cfg.lr), dtype=torch.float32, device=device)} for g in groups]
        lr = torch.tensor(cfg.lr, device=device)
        if cfg.optimizer == "sgd":
            # fused SGD reads a tensor LR on the device; its momentum buffers exist after the capture's warm-up
            return torch.optim.SGD(groups, lr=lr, momentum=0.9, nesterov=True, fused=True)
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=True, capturable=True)
    if cfg.optimizer == "sgd":
        # On a CPU, torch's default SGD loops over the tensors one op at a time: the text bag's update (a 7 MB weight)
        # took 20% of its step that way (9,200 vs 13,200 samples/s)
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=0.9, nesterov=True, fused=fused_sgd(device))
    # fused AdamW is deterministic and fast on CUDA; foreach elsewhere (on a CPU fused AdamW changes the bits and was
    # no faster for the classifier).
    fused = device.type == "cuda"
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), fused=fused, foreach=None if fused else True)


def fused_sgd(device: torch.device) -> bool:
    """Whether torch has a fused SGD kernel for `device` (CPU and CUDA do)."""
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    return device.type in _get_fused_kernels_supported_devices()


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


def warmup_cosine_on_device(step: torch.Tensor, total_steps: int, warmup_steps: int, schedule: str,
                            min_ratio: float = 0.01) -> torch.Tensor:
    """warmup_cosine's factor computed from a step count held on the device (float64): no host round trip, so a
    CUDA graph can replay it."""
    s = step.double()
    factor = torch.ones_like(s)
    if schedule != "constant":
        progress = ((s - warmup_steps) / max(1, total_steps - warmup_steps)).clamp(0.0, 1.0)
        factor = min_ratio + (1 - min_ratio) * 0.5 * (1 + torch.cos(math.pi * progress))
    if warmup_steps:
        factor = torch.where(s < warmup_steps, (s + 1) / warmup_steps, factor)
    return factor


def plateau_factor(step: int, warmup_steps: int, cooldown: tuple[int, int] | None, min_ratio: float = 0.01) -> float:
    """The plateau schedule's LR multiplier: linear warmup, then 1 until the cooldown (start, steps) begins, then a
    linear decay to `min_ratio` over its steps (warmup-stable-decay: Hu et al. 2024, Hägele et al. 2024)."""
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    if cooldown is None or step < cooldown[0]:
        return 1.0
    return 1.0 - (1 - min_ratio) * min(1.0, (step - cooldown[0] + 1) / max(1, cooldown[1]))


def plateau_on_device(step: torch.Tensor, warmup_steps: int, start: torch.Tensor, steps: torch.Tensor,
                      min_ratio: float = 0.01) -> torch.Tensor:
    """plateau_factor from device tensors (a cooldown not begun: `start` beyond any step), for a CUDA graph."""
    s = step.double()
    factor = torch.where(s < start, torch.ones_like(s),
                         1.0 - (1 - min_ratio) * ((s - start + 1) / steps.clamp(min=1)).clamp(max=1.0))
    if warmup_steps:
        factor = torch.where(s < warmup_steps, (s + 1) / warmup_steps, factor)
    return factor


class LRSchedule:
    """Each param group's LR at optimizer step k is its base LR x the schedule's factor at k (warmup_cosine, or
    plateau_factor with the cooldown fit starts at a plateau): set from the host for a float LR, or on the device when
    the LRs are tensors (capturable optimizers)."""

    NOT_YET = 2.0**62  # a cooldown start beyond any step

    def __init__(self, optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int, schedule: str):
        self.optimizer, self.total, self.warmup, self.schedule = optimizer, total_steps, warmup_steps, schedule
        self.base = [float(g["lr"]) for g in optimizer.param_groups]
        self.on_device = all(torch.is_tensor(g["lr"]) for g in optimizer.param_groups)
        self.cooldown: tuple[int, int] | None = None
        if schedule == "plateau":
            self.factor = lambda step: plateau_factor(step, warmup_steps, self.cooldown)
            device = optimizer.param_groups[0]["lr"].device if self.on_device else "cpu"
            self._cooldown_t = (torch.full((), self.NOT_YET, dtype=torch.float64, device=device),
                                torch.ones((), dtype=torch.float64, device=device))
        else:
            self.factor = warmup_cosine(total_steps, warmup_steps, schedule)

    def cool_down(self, start: int, steps: int) -> None:
        """The plateau schedule's cooldown: from optimizer step `start`, `steps` long."""
        self.cooldown = (start, steps)
        self._cooldown_t[0].fill_(start)
        self._cooldown_t[1].fill_(steps)

    def lr_at(self, step: int) -> float:
        """The first group's LR for optimizer step `step` (what LambdaLR reports after `step` updates)."""
        return self.base[0] * self.factor(step)

    def set(self, step: int | torch.Tensor) -> None:
        """Set the LRs for optimizer step `step` (an int on the host, or a device tensor when `on_device`)."""
        if self.on_device and torch.is_tensor(step):
            factor = plateau_on_device(step, self.warmup, *self._cooldown_t) if self.schedule == "plateau" else \
                warmup_cosine_on_device(step, self.total, self.warmup, self.schedule)
            for group, base in zip(self.optimizer.param_groups, self.base):
                group["lr"].copy_(base * factor)
            return
        factor = self.factor(int(step))
        for group, base in zip(self.optimizer.param_groups, self.base):
            if torch.is_tensor(group["lr"]):
                group["lr"].fill_(base * factor)
            else:
                group["lr"] = base * factor


def build_scheduler(optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int, schedule: str):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(total_steps, warmup_steps, schedule))
