"""The prepared-data format on disk: one safetensors file per split (or its shards, for a large split) plus
meta.json (and preprocessing.json: trainlab.data.preprocessing), read and written safely. torch and safetensors load
only where tensors are read or written: a stage that reads only meta.json and the JSON lines (the TF-IDF baseline)
never loads torch."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainlab.core.atomic import atomic_path, write_json
from trainlab.core.errors import DataError
from trainlab.data.preprocessing import stored_size

if TYPE_CHECKING:
    import torch

SPLITS = ("train", "val", "test")
META_FILE = "meta.json"
FORMAT_TAG = {"format": "trainlab-prepared-v1"}


SHARD_BYTES = 64 * 2**20  # a split larger than this is written as several shards of at most about this size
SHARD_RE = r"-\d{5}"


def split_path(folder: str | Path, split: str) -> Path:
    """Where a split's tensors live when it is one file: ``<folder>/<split>.safetensors`` (larger splits are shards
    ``<split>-00000.safetensors``, ``<split>-00001.safetensors``, ...: see split_files)."""
    return Path(folder) / f"{split}.safetensors"


def shard_path(folder: str | Path, split: str, index: int) -> Path:
    return Path(folder) / f"{split}-{index:05d}.safetensors"


def split_files(folder: str | Path, split: str) -> list[Path]:
    """A split's files in order: the one file, or its shards; a DataError naming the folder if there are none."""
    single = split_path(folder, split)
    if single.is_file():
        return [single]
    shards = sorted(p for p in Path(folder).glob(f"{split}-*.safetensors") if re.fullmatch(split + SHARD_RE, p.stem))
    if not shards:
        raise DataError(f"{single}: prepared split not found (run `dvc repro prepare` first)")
    return shards


def save_split(folder: str | Path, split: str, tensors: dict[str, torch.Tensor]) -> Path:
    """Write a split's tensors as one file, atomically; the same tensors always give the same bytes."""
    return save_tensors(split_path(folder, split), tensors)


def save_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    from safetensors.torch import save_file

    contiguous = {name: tensor.detach().cpu().contiguous() for name, tensor in tensors.items()}
    with atomic_path(path) as tmp:
        save_file(contiguous, str(tmp), metadata=FORMAT_TAG)
    return path


def read_tensors(path: Path, device: str | torch.device | None = None) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device=str(device or "cpu"))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise DataError(f"{path}: not a readable safetensors file ({exc}); rerun `dvc repro prepare`") from None


def load_split(folder: str | Path, split: str, device: str | torch.device | None = None) -> dict[str, torch.Tensor]:
    """Read a split's tensors whole (its shards concatenated; no pickle involved); a missing or corrupt file is a
    DataError naming it."""
    import torch

    parts = [read_tensors(path, device) for path in split_files(folder, split)]
    if len(parts) == 1:
        return parts[0]
    names = parts[0].keys()
    for path, part in zip(split_files(folder, split)[1:], parts[1:]):
        if part.keys() != names:
            raise DataError(f"{path}: tensors {sorted(part)} differ from the first shard's {sorted(names)}")
    return {name: torch.cat([part[name] for part in parts]) for name in names}


class ShardWriter:
    """Writes one split as shards of `samples_per_shard` samples, as they come, holding at most one shard in memory.
    ``close`` names a split of a single shard ``<split>.safetensors``; the shard boundaries depend only on the
    samples, so the bytes do not depend on how they were produced."""

    def __init__(self, folder: str | Path, split: str, bytes_per_sample: int, shard_bytes: int = SHARD_BYTES):
        self.folder, self.split = Path(folder), split
        self.samples_per_shard = max(1, shard_bytes // max(1, bytes_per_sample))
        self.pending: dict[str, list[torch.Tensor]] = {}
        self.count = self.shards = 0
        self.buffered = 0

    def add(self, tensors: dict[str, torch.Tensor]) -> None:
        """Append a batch (N, ...) per name; full shards are written at once."""
        n = len(next(iter(tensors.values())))
        start = 0
        while start < n:
            take = min(n - start, self.samples_per_shard - self.buffered)
            for name, tensor in tensors.items():
                self.pending.setdefault(name, []).append(tensor[start:start + take])
            self.buffered += take
            start += take
            if self.buffered == self.samples_per_shard:
                self._flush()
        self.count += n

    def _flush(self) -> None:
        import torch

        if not self.buffered:
            return
        save_tensors(shard_path(self.folder, self.split, self.shards),
                     {name: torch.cat(parts) for name, parts in self.pending.items()})
        self.pending, self.buffered = {}, 0
        self.shards += 1

    def close(self) -> int:
        """Write what is left; returns the number of samples written."""
        self._flush()
        if self.shards == 1:
            os.replace(shard_path(self.folder, self.split, 0), split_path(self.folder, self.split))
        return self.count


def save_meta(folder: str | Path, meta: dict[str, Any]) -> Path:
    """Write ``meta.json`` (sorted keys, so it is byte-stable)."""
    path = Path(folder) / META_FILE
    write_json(path, meta)
    return path


def load_meta(folder: str | Path) -> dict[str, Any]:
    """Read ``meta.json`` of a prepared dataset, with the stored image size (channels, height, width) of an image
    task from its preprocessing.json, the one place prepare writes it (a meta.json written before keeps its own);
    missing or invalid JSON is a DataError naming the file."""
    path = Path(folder) / META_FILE
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(f"{path}: prepared metadata not found (run `dvc repro prepare` first)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise DataError(f"{path}: not a JSON object (rerun `dvc repro prepare`)")
    return {**stored_size(folder), **meta}


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
