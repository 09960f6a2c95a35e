"""Trained models on disk (models/<task>/): load the architecture from config.json and weights from safetensors."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from trainlab.core.errors import CheckpointError
from trainlab.engine.checkpoint import load_model_state
from trainlab.tasks.spec import build_from_config


@dataclass
class SavedModel:
    model: torch.nn.Module
    config: dict  # architecture (trainlab.tasks.spec.build_from_config)
    info: dict  # task, data meta, test metrics, MLflow run id, environment
    folder: Path


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing (run the training stage first)") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None


def load_saved_model(folder: str | Path, task: str, device: str | torch.device = "cpu") -> SavedModel:
    """Rebuild and load a model written by a training stage; mismatches raise CheckpointError naming the file."""
    folder = Path(folder)
    config = read_json(folder / "config.json")
    info = read_json(folder / "info.json") if (folder / "info.json").exists() else {}
    model = build_from_config(task, config)
    weights = folder / "model.safetensors"
    try:
        state = load_file(str(weights))
    except FileNotFoundError:
        raise CheckpointError(f"{weights}: missing (run the training stage first)") from None
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"{weights}: not a readable safetensors file ({exc})") from None
    load_model_state(model, state, str(weights))
    return SavedModel(model.to(device).eval(), config, info, folder)
