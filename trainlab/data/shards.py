"""Prepared splits read lazily: each tensor of a split (its one file or its shards) as a column whose rows are read
from disk on demand with positioned reads, so a split larger than memory can be trained on a batch at a time."""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from trainlab.core.errors import DataError
from trainlab.data.prepared import split_files

# safetensors dtype names -> NumPy (the formats prepare writes; bf16/f16 are read as their bits and viewed)
DTYPES = {"U8": np.uint8, "I8": np.int8, "I16": np.int16, "I32": np.int32, "I64": np.int64, "F32": np.float32,
          "F64": np.float64, "F16": np.float16, "BOOL": np.bool_, "BF16": np.int16}
HEADER_LIMIT = 100 * 2**20  # safetensors' own limit on the JSON header


@dataclass(frozen=True)
class TensorEntry:
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute byte offset of row 0 in the file


def read_header(path: Path) -> dict[str, TensorEntry]:
    """The tensors of a safetensors file (dtype, shape, where their bytes start), from its header alone."""
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > HEADER_LIMIT:
                raise ValueError(f"header of {length} bytes")
            header = json.loads(f.read(length))
    except (OSError, struct.error, ValueError) as exc:
        raise DataError(f"{path}: not a readable safetensors file ({exc}); rerun `dvc repro prepare`") from None
    base = 8 + length
    return {name: TensorEntry(info["dtype"], tuple(info["shape"]), base + info["data_offsets"][0])
            for name, info in header.items() if name != "__metadata__"}


class ShardSplit:
    """A prepared split on disk, tensors as lazy Columns (``split["images"][idx]`` reads just those rows)."""

    def __init__(self, folder: str | Path, split: str):
        self.files = split_files(folder, split)
        self.headers = [read_header(path) for path in self.files]
        names = list(self.headers[0])
        for path, header in zip(self.files, self.headers):
            if list(header) != names:
                raise DataError(f"{path}: tensors {sorted(header)} differ from {self.files[0]}'s {sorted(names)}")
        for path, header in zip(self.files, self.headers):
            lengths = {name: entry.shape[0] if entry.shape else 0 for name, entry in header.items()}
            if len(set(lengths.values())) > 1:
                raise DataError(f"{path}: " + " but ".join(f"{n} {name}" for name, n in sorted(lengths.items()))
                                + "; they must match")
        self.counts = [header[names[0]].shape[0] if header[names[0]].shape else 0 for header in self.headers]
        self.offsets = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)
        self.columns = {name: Column(self, name) for name in names}
        self._fds: dict[int, int] = {}
        self._pid = os.getpid()

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, name: str) -> Column:
        return self.columns[name]

    def __contains__(self, name: object) -> bool:
        return name in self.columns

    def keys(self):
        return self.columns.keys()

    def items(self):
        return self.columns.items()

    def values(self):
        return self.columns.values()

    @property
    def nbytes(self) -> int:
        return sum(column.nbytes for column in self.columns.values())

    def load(self) -> dict[str, torch.Tensor]:
        """Every tensor whole, in memory (what prepared.load_split gives)."""
        return {name: column.load() for name, column in self.columns.items()}

    def fd(self, shard: int) -> int:
        if os.getpid() != self._pid:  # a DataLoader worker: open its own descriptors
            self._fds, self._pid = {}, os.getpid()
        if shard not in self._fds:
            self._fds[shard] = os.open(self.files[shard], os.O_RDONLY)
        return self._fds[shard]

    def __getstate__(self):
        return {**self.__dict__, "_fds": {}}

    def __del__(self):
        for fd in getattr(self, "_fds", {}).values():
            try:
                os.close(fd)
            except OSError:
                pass


class Column:
    """One tensor of a ShardSplit, optionally a view on some of its rows: indexing reads the rows asked for."""

    def __init__(self, split: ShardSplit, name: str, rows: np.ndarray | None = None):
        self.split, self.name, self.rows = split, name, rows
        entry = split.headers[0][name]
        self.row_shape = entry.shape[1:]
        self.np_dtype = np.dtype(DTYPES[entry.dtype])
        self.torch_dtype = (torch.bfloat16 if entry.dtype == "BF16"
                            else torch.from_numpy(np.zeros(0, self.np_dtype)).dtype)
        self.row_bytes = int(np.prod(self.row_shape, dtype=np.int64)) * self.np_dtype.itemsize

    def __len__(self) -> int:
        return len(self.split) if self.rows is None else len(self.rows)

    @property
    def shape(self) -> torch.Size:
        return torch.Size((len(self), *self.row_shape))

    @property
    def ndim(self) -> int:
        return 1 + len(self.row_shape)

    @property
    def dtype(self) -> torch.dtype:
        return self.torch_dtype

    @property
    def nbytes(self) -> int:
        return len(self) * self.row_bytes

    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def element_size(self) -> int:
        return self.np_dtype.itemsize

    def is_floating_point(self) -> bool:
        return self.torch_dtype.is_floating_point

    def __getitem__(self, key) -> torch.Tensor | Column:
        """A slice with a step is a lazy view (as DDP ranks take theirs); anything else reads those rows now."""
        if isinstance(key, slice) and key.step not in (None, 1):
            return Column(self.split, self.name, self._global(np.arange(len(self))[key]))
        if isinstance(key, slice):
            return self.read(np.arange(len(self))[key])
        if isinstance(key, int):
            return self.read(np.array([key]))[0]
        index = key.cpu().numpy() if torch.is_tensor(key) else np.asarray(key)
        if index.dtype == np.bool_:
            index = np.flatnonzero(index)
        return self.read(index.astype(np.int64))

    def _global(self, index: np.ndarray) -> np.ndarray:
        return index if self.rows is None else self.rows[index]

    def read(self, index: np.ndarray) -> torch.Tensor:
        """Rows `index` (of this view) as one tensor, in that order; consecutive rows are read in one call."""
        rows = self._global(np.asarray(index, dtype=np.int64).reshape(-1))
        if len(rows) and (rows.min() < 0 or rows.max() >= len(self.split)):
            raise IndexError(f"{self.name}: rows outside 0..{len(self.split) - 1}")
        out = np.empty((len(rows), *self.row_shape), dtype=self.np_dtype)
        if not len(rows):
            return torch.from_numpy(out)
        flat = out.reshape(len(rows), -1).view(np.uint8)
        order = np.argsort(rows, kind="stable")
        shards = np.searchsorted(self.split.offsets, rows[order], side="right") - 1
        i = 0
        while i < len(order):  # runs of consecutive rows of one shard: one pread each
            j = i + 1
            while j < len(order) and shards[j] == shards[i] and rows[order[j]] == rows[order[j - 1]] + 1:
                j += 1
            shard = int(shards[i])
            local = int(rows[order[i]] - self.split.offsets[shard])
            start = self.split.headers[shard][self.name].start + local * self.row_bytes
            data = os.pread(self.split.fd(shard), (j - i) * self.row_bytes, start)
            if len(data) != (j - i) * self.row_bytes:
                raise DataError(f"{self.split.files[shard]}: not a readable safetensors file (shorter than its "
                                "header says); rerun `dvc repro prepare`")
            block = np.frombuffer(data, dtype=np.uint8).reshape(j - i, self.row_bytes)
            if np.all(np.diff(order[i:j]) == 1):
                flat[order[i]:order[i] + (j - i)] = block
            else:
                flat[order[i:j]] = block
            i = j
        tensor = torch.from_numpy(out)
        return tensor.view(torch.bfloat16) if self.torch_dtype == torch.bfloat16 else tensor

    def load(self) -> torch.Tensor:
        return self.read(np.arange(len(self)))

    def chunks(self, size: int = 65536):
        for start in range(0, len(self), size):
            yield self.read(np.arange(start, min(start + size, len(self))))

    def min(self) -> torch.Tensor:
        return torch.stack([chunk.min() for chunk in self.chunks()]).min()

    def max(self) -> torch.Tensor:
        return torch.stack([chunk.max() for chunk in self.chunks()]).max()

    def tolist(self) -> list:
        return self.load().tolist()


def open_split(folder: str | Path, split: str, max_in_memory_mb: int | None = None,
               streamable: bool = True) -> dict[str, torch.Tensor] | ShardSplit:
    """A prepared split whole in memory when it fits in `max_in_memory_mb` (base.data_on_device_max_mb; None: any
    size) or cannot be streamed, else as a ShardSplit read from disk a batch at a time."""
    lazy = ShardSplit(folder, split)
    if max_in_memory_mb is None or not streamable or lazy.nbytes <= max_in_memory_mb * 2**20:
        return lazy.load()
    return lazy
