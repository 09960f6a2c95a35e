"""torchvision datasets from raw files under data/raw: fake MNIST idx files, a fake CIFAR10, clear errors."""

import pickle

import numpy as np
import pytest

from tests.data.factories import make_fake_mnist
from trainlab.data.torchvision_raw import load_official_splits
from trainlab.core.errors import DataError


def test_mnist_idx_files(tmp_path):
    data = load_official_splits("mnist", make_fake_mnist(tmp_path))
    assert data.train_images.shape == (40, 1, 28, 28) and data.train_images.dtype == np.uint8
    assert data.test_labels.tolist() == list(range(10)) and data.class_names[3] == "3"


def test_fashion_mnist_class_names(tmp_path):
    data = load_official_splits("fashion_mnist", make_fake_mnist(tmp_path, folder="FashionMNIST"))
    assert data.class_names[0] == "T-shirt/top" and len(data.train_labels) == 40


def test_missing_raw_file_is_named_with_a_gz_hint(tmp_path):
    make_fake_mnist(tmp_path)
    raw = tmp_path / "MNIST" / "raw"
    (raw / "t10k-labels-idx1-ubyte").rename(raw / "t10k-labels-idx1-ubyte.gz")
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte: raw mnist file missing \(found .*gunzip"):
        load_official_splits("mnist", tmp_path)


def test_corrupt_idx_file_is_named(tmp_path):
    make_fake_mnist(tmp_path)
    (tmp_path / "MNIST" / "raw" / "train-images-idx3-ubyte").write_bytes(b"\xff" * 20)
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte: corrupt idx file"):
        load_official_splits("mnist", tmp_path)


def test_cifar10_batches(tmp_path, monkeypatch):
    import torchvision.datasets.cifar as cifar

    monkeypatch.setattr(cifar, "check_integrity", lambda *args, **kwargs: True)
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {"data": rng.integers(0, 256, (10, 3072), dtype=np.uint8), "labels": list(range(10))}
        (folder / name).write_bytes(pickle.dumps(batch))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"c{i}" for i in range(10)]}))
    data = load_official_splits("cifar10", tmp_path)
    assert data.train_images.shape == (50, 3, 32, 32) and data.test_images.shape == (10, 3, 32, 32)
    assert data.class_names[9] == "c9"
