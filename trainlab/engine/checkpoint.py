"""Full-state checkpoints (model, optimizer, scheduler, scaler, EMA, step, every RNG), written atomically, loaded
safely."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainlab.core.atomic import atomic_path
from trainlab.core.errors import CheckpointError


def rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what rng_state saved. The states are byte tensors that NumPy and torch read on the CPU, so a state
    loaded onto another device is brought back first."""
    random.setstate(_as_tuple(state["python"]))
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].cpu().numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    torch.set_rng_state(state["torch"].cpu())
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def _as_tuple(x):
    return tuple(_as_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> None:
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load with weights_only=True: tensors and plain containers only, never arbitrary pickled objects."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: checkpoint not found") from None
    except Exception as exc:  # corrupt, truncated or unsafe content
        raise CheckpointError(f"{path}: not a valid checkpoint ({type(exc).__name__}: {exc})") from None


def load_model_state(model: torch.nn.Module, state_dict: dict[str, torch.Tensor], source: str) -> None:
    """Load weights strictly; a checkpoint from another architecture or class count gets a clear error."""
    own = model.state_dict()
    missing = sorted(set(own) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(own))
    mismatched = [f"{k}: saved {tuple(state_dict[k].shape)} vs model {tuple(v.shape)}"
                  for k, v in own.items() if k in state_dict and state_dict[k].shape != v.shape]
    if missing or unexpected or mismatched:
        parts = []
        if mismatched:
            parts.append("shape mismatch " + "; ".join(mismatched[:3]))
        if missing:
            parts.append(f"missing keys {missing[:3]}{'...' if len(missing) > 3 else ''}")
        if unexpected:
            parts.append(f"unexpected keys {unexpected[:3]}{'...' if len(unexpected) > 3 else ''}")
        raise CheckpointError(f"{source}: does not match the model ({'; '.join(parts)}); "
                              "was it saved from another architecture or number of classes?")
    model.load_state_dict(state_dict)
