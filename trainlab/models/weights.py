"""Weights from a local file into a model, strictly, and the parameters outside a model's head."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from trainlab.core.errors import CheckpointError


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
