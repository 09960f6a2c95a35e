"""torchvision's MNIST, FashionMNIST and CIFAR10 read from their raw files under data/raw (download on request)."""

from __future__ import annotations

import gzip
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torchvision

from trainlab.core.errors import DataError

MNIST_LIKE = {"mnist": torchvision.datasets.MNIST, "fashion_mnist": torchvision.datasets.FashionMNIST}
MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


@dataclass
class OfficialSplits:
    """A torchvision dataset as uint8 (N, C, H, W) images and int64 labels, with its official test part kept apart."""

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    class_names: list[str]


def raw_folder(source: str, root: Path) -> Path:
    """Where torchvision keeps the raw files: <root>/MNIST/raw, <root>/FashionMNIST/raw, <root>/cifar-10-batches-py."""
    if source == "cifar10":
        return root / torchvision.datasets.CIFAR10.base_folder
    return root / MNIST_LIKE[source].__name__ / "raw"


def expected_files(source: str, root: Path) -> list[Path]:
    folder = raw_folder(source, root)
    if source == "cifar10":
        names = [name for name, _ in torchvision.datasets.CIFAR10.train_list + torchvision.datasets.CIFAR10.test_list]
        return [folder / name for name in [*names, torchvision.datasets.CIFAR10.meta["filename"]]]
    return [folder / name for pair in MNIST_FILES.values() for name in pair]


def gzipped(path: Path) -> Path:
    """The official distribution's name for an idx file: the same name with .gz."""
    return path.with_name(path.name + ".gz")


def present(source: str, path: Path) -> Path | None:
    """The file to read for an expected raw file: itself, or (MNIST-like idx files) its .gz beside it; None if
    neither."""
    if path.is_file():
        return path
    if source in MNIST_LIKE and gzipped(path).is_file():
        return gzipped(path)
    return None


def require_raw_files(source: str, root: Path) -> None:
    """Every raw file must be present; the error names the first missing one (and its .gz name) and how to get it."""
    for path in expected_files(source, root):
        if present(source, path) is None:
            names = f"{path} (or {gzipped(path).name})" if source in MNIST_LIKE else str(path)
            raise DataError(f"{names}: raw {source} file missing. Put the dataset's raw files there, or run "
                            "`python -m stages.prepare ... --download` once while online, then `dvc add` the folder")


def download(source: str, root: Path) -> None:
    """Fetch the raw files with torchvision (needs internet); only called when the user asks for it."""
    root.mkdir(parents=True, exist_ok=True)
    dataset_class = torchvision.datasets.CIFAR10 if source == "cifar10" else MNIST_LIKE[source]
    try:
        for train in (True, False):
            dataset_class(str(root), train=train, download=True)
    except (OSError, RuntimeError) as exc:
        raise DataError(f"{root}: downloading {source} failed ({exc})") from None


def load_official_splits(source: str, root: str | Path, allow_download: bool = False) -> OfficialSplits:
    """Load MNIST / FashionMNIST / CIFAR10 from ``root``; missing files are errors unless a download is allowed."""
    root = Path(root)
    if allow_download and not all(present(source, p) for p in expected_files(source, root)):
        download(source, root)
    require_raw_files(source, root)
    if source == "cifar10":
        return load_cifar10(root)
    return load_mnist_like(source, root)


def read_idx_pair(folder: Path, image_name: str, label_name: str) -> tuple[np.ndarray, np.ndarray]:
    """One images/labels pair of idx files (plain or .gz) as (N, 1, H, W) uint8 and (N,) int64."""
    image_path = present("mnist", folder / image_name) or folder / image_name
    label_path = present("mnist", folder / label_name) or folder / label_name
    images = read_idx(image_path, ndim=3)
    labels = read_idx(label_path, ndim=1)
    if len(images) != len(labels):
        raise DataError(f"{label_path}: {len(labels)} labels for {len(images)} images in {image_path.name}")
    return images[:, None], labels.astype(np.int64)


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """A uint8 idx file of ``ndim`` dimensions; a name ending in .gz is decompressed in memory."""
    try:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        what = "corrupt gzip file" if path.suffix == ".gz" else "unreadable idx file"
        raise DataError(f"{path}: {what} ({type(exc).__name__}: {exc})") from None
    try:
        return parse_idx(raw, ndim)
    except ValueError as exc:
        raise DataError(f"{path}: corrupt idx file ({exc})") from None


def parse_idx(raw: bytes, ndim: int) -> np.ndarray:
    """The idx format (LeCun's MNIST files): 0, 0, type 0x08 (uint8), ndim, ndim big-endian int32 sizes, the data."""
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise ValueError("bad header: not an idx file")
    if raw[2] != 0x08:
        raise ValueError(f"data type 0x{raw[2]:02x}, expected 0x08 (uint8)")
    if raw[3] != ndim:
        raise ValueError(f"{raw[3]} dimensions, expected {ndim}")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError("truncated header")
    shape = tuple(int(n) for n in np.frombuffer(raw, ">i4", count=ndim, offset=4))
    size = int(np.prod(shape, dtype=np.int64))
    if len(raw) - header != size:
        raise ValueError(f"{len(raw) - header} bytes of data for shape {shape} ({size} expected)")
    return np.frombuffer(raw, np.uint8, offset=header).reshape(shape).copy()


def load_mnist_like(source: str, root: Path) -> OfficialSplits:
    folder = raw_folder(source, root)
    train_images, train_labels = read_idx_pair(folder, *MNIST_FILES["train"])
    test_images, test_labels = read_idx_pair(folder, *MNIST_FILES["test"])
    class_names = [str(d) for d in range(10)] if source == "mnist" else list(MNIST_LIKE[source].classes)
    check_label_range(np.concatenate([train_labels, test_labels]), len(class_names), folder)
    return OfficialSplits(train_images, train_labels, test_images, test_labels, class_names)


def load_cifar10(root: Path) -> OfficialSplits:
    parts = []
    for train in (True, False):
        try:
            dataset = torchvision.datasets.CIFAR10(str(root), train=train, download=False)
        except (RuntimeError, OSError, EOFError, KeyError, ValueError) as exc:
            raise DataError(f"{raw_folder('cifar10', root)}: corrupt CIFAR10 files ({exc})") from None
        parts.append((np.ascontiguousarray(dataset.data.transpose(0, 3, 1, 2)), np.asarray(dataset.targets, np.int64)))
    (train_images, train_labels), (test_images, test_labels) = parts
    return OfficialSplits(train_images, train_labels, test_images, test_labels, list(dataset.classes))


def check_label_range(labels: np.ndarray, num_classes: int, where: os.PathLike) -> None:
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise DataError(f"{where}: labels outside 0..{num_classes - 1}")
