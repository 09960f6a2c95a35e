"""Lineage: the data hash from dvc.lock, file MD5s, and prepared splits as MLflow dataset inputs."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

LOCK_FILE = "dvc.lock"


def data_hash(stage: str, lock_path: str | os.PathLike = LOCK_FILE) -> str:
    """A short hash over the md5s of ``stage``'s deps in dvc.lock; 'none' when there is no lock or no such stage.

    dvc writes a stage's own lock entry only after the stage finishes, so while it runs its dep entries describe
    the previous run; for a dep that is an upstream stage's out, the upstream entry (already rewritten when that
    stage ran) is preferred.
    """
    path = Path(lock_path)
    if not path.is_file():
        return "none"
    try:
        lock = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return "unreadable"
    stages = lock.get("stages") if isinstance(lock, dict) else None
    if not isinstance(stages, dict) or not isinstance(stages.get(stage), dict):
        return "none"
    fresh_outs: dict[str, str] = {}
    for name, entry in stages.items():
        if name != stage and isinstance(entry, dict):
            for out in entry.get("outs") or []:
                if isinstance(out, dict) and out.get("path") and _entry_hash(out):
                    fresh_outs[str(out["path"]).rstrip("/")] = _entry_hash(out)
    lines = []
    for dep in stages[stage].get("deps") or []:
        if not isinstance(dep, dict) or not dep.get("path"):
            continue
        dep_path = str(dep["path"]).rstrip("/")
        lines.append(f"{dep_path}\t{fresh_outs.get(dep_path) or _entry_hash(dep) or 'missing'}")
    if not lines:
        return "none"
    return hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()[:12]


def _entry_hash(entry: dict) -> str:
    for key in ("md5", "etag", "checksum"):
        if entry.get(key):
            return str(entry[key])
    return ""


@dataclass(frozen=True)
class DataInput:
    """A data split a run reads, logged as an MLflow dataset input: its name, source path, and context
    (training / validation / test); the digest is the file's md5, the hash DVC records for it."""

    name: str
    path: str
    context: str


SPLIT_CONTEXTS = {"train": "training", "val": "validation", "test": "test"}


def split_inputs(data_dir: str | os.PathLike, splits: Sequence[str] = ("train", "val", "test")) -> list[DataInput]:
    """The DataInputs of a prepared-data folder's splits (``<folder>/<split>.safetensors``, or its first shard
    ``<split>-00000.safetensors`` for a split written in shards: the digest then covers every shard)."""
    folder = Path(data_dir)
    inputs = []
    for split in splits:
        single, first = folder / f"{split}.safetensors", folder / f"{split}-00000.safetensors"
        path = first if not single.exists() and first.exists() else single
        inputs.append(DataInput(f"{folder.name}/{split}", str(path), SPLIT_CONTEXTS[split]))
    return inputs


def split_md5(path: str | os.PathLike) -> str:
    """The md5 of a split file, or for a first shard the md5 of its shards' md5s (in order)."""
    path = Path(path)
    if not path.name.endswith("-00000.safetensors"):
        return file_md5(path)
    split = path.name[:-len("-00000.safetensors")]
    shards = sorted(p for p in path.parent.glob(f"{split}-*.safetensors"))
    return hashlib.md5("".join(file_md5(p) for p in shards).encode()).hexdigest()


def file_md5(path: str | os.PathLike) -> str:
    """The md5 of a file's bytes: what DVC 3 records as the file's hash (in dvc.lock and in a folder's .dir)."""
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def dataset_records(inputs: Sequence[DataInput]) -> list[dict[str, str]]:
    """What MLflow records of each split a run reads (name, md5 digest, source, context), worked out now: plain data
    that a run opened later (after an outage, from a spool) logs as it was when the stage read it."""
    return [{"name": i.name, "digest": split_md5(i.path), "source": json.dumps({"uri": i.path}), "context": i.context}
            for i in inputs]


def dataset_inputs(records: Sequence[dict[str, str]]) -> list[Any]:
    """`dataset_records` as MLflow dataset inputs (local sources, with their training/validation/test context)."""
    from mlflow.entities import Dataset, DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    return [DatasetInput(Dataset(name=r["name"], digest=r["digest"], source_type="local", source=r["source"]),
                         tags=[InputTag(MLFLOW_DATASET_CONTEXT, r["context"])]) for r in records]
