"""The prepared-data format on disk: one safetensors file per split plus meta.json, read and written safely."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from trainlab.core.atomic import atomic_path, write_json
from trainlab.core.errors import DataError

SPLITS = ("train", "val", "test")
META_FILE = "meta.json"
FORMAT_TAG = {"format": "trainlab-prepared-v1"}


def split_path(folder: str | Path, split: str) -> Path:
    """Where a split's tensors live: ``<folder>/<split>.safetensors``."""
    return Path(folder) / f"{split}.safetensors"


def save_split(folder: str | Path, split: str, tensors: dict[str, torch.Tensor]) -> Path:
    """Write a split's tensors atomically; the same tensors always give the same bytes."""
    path = split_path(folder, split)
    contiguous = {name: tensor.detach().cpu().contiguous() for name, tensor in tensors.items()}
    with atomic_path(path) as tmp:
        save_file(contiguous, str(tmp), metadata=FORMAT_TAG)
    return path


def load_split(folder: str | Path, split: str, device: str | torch.device | None = None) -> dict[str, torch.Tensor]:
    """Read a split's tensors (no pickle involved); a missing or corrupt file is a DataError naming it."""
    path = split_path(folder, split)
    if not path.is_file():
        raise DataError(f"{path}: prepared split not found (run `dvc repro prepare` first)")
    try:
        return load_file(str(path), device=str(device or "cpu"))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise DataError(f"{path}: not a readable safetensors file ({exc}); rerun `dvc repro prepare`") from None


def save_meta(folder: str | Path, meta: dict[str, Any]) -> Path:
    """Write ``meta.json`` (sorted keys, so it is byte-stable)."""
    path = Path(folder) / META_FILE
    write_json(path, meta)
    return path


def load_meta(folder: str | Path) -> dict[str, Any]:
    """Read ``meta.json`` of a prepared dataset; missing or invalid JSON is a DataError naming it."""
    path = Path(folder) / META_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(f"{path}: prepared metadata not found (run `dvc repro prepare` first)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: not valid JSON ({exc})") from None


def save_jsonl(path: str | Path, rows: list[dict[str, Any]]) -> Path:
    """Write one JSON object per line, atomically; sorted keys, non-ASCII escaped, so any reader splits it safely."""
    path = Path(path)
    lines = "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)
    with atomic_path(path) as tmp:
        tmp.write_text(lines, encoding="ascii")
    return path


def load_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Read a JSON-lines file written by save_jsonl; errors name the file and line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="ascii")
    except FileNotFoundError:
        raise DataError(f"{path}: file not found (run `dvc repro prepare` first)") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not a JSON-lines file written by prepare ({exc.reason})") from None
    rows = []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{number}: not valid JSON ({exc})") from None
    return rows
