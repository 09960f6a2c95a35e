"""torchvision datasets from raw files under data/raw: fake MNIST idx files (plain or .gz), a fake CIFAR10, errors."""

import gzip
import pickle
from pathlib import Path

import numpy as np
import pytest

from tests.data.factories import make_fake_mnist
from trainlab.core.errors import DataError
from trainlab.data.torchvision_raw import load_official_splits


def test_mnist_idx_files(tmp_path):
    data = load_official_splits("mnist", make_fake_mnist(tmp_path))
    assert data.train_images.shape == (40, 1, 28, 28) and data.train_images.dtype == np.uint8
    assert data.test_labels.tolist() == list(range(10)) and data.class_names[3] == "3"


def test_fashion_mnist_class_names(tmp_path):
    data = load_official_splits("fashion_mnist", make_fake_mnist(tmp_path, folder="FashionMNIST"))
    assert data.class_names[0] == "T-shirt/top" and len(data.train_labels) == 40


QUALITY = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "quality"


def gzip_in_place(path: Path) -> None:
    """Replace an idx file by its .gz, as the official distribution ships it."""
    path.with_name(path.name + ".gz").write_bytes(gzip.compress(path.read_bytes()))
    path.unlink()


def test_gzipped_idx_files_read_identically_to_plain_ones(tmp_path):
    plain = load_official_splits("fashion_mnist", make_fake_mnist(tmp_path / "plain", folder="FashionMNIST"))
    raw = make_fake_mnist(tmp_path / "gz", folder="FashionMNIST") / "FashionMNIST" / "raw"
    for path in sorted(raw.iterdir()):
        gzip_in_place(path)
    assert sorted(p.name for p in raw.iterdir())[0] == "t10k-images-idx3-ubyte.gz"
    packed = load_official_splits("fashion_mnist", tmp_path / "gz")
    for name in ("train_images", "train_labels", "test_images", "test_labels"):
        a, b = getattr(plain, name), getattr(packed, name)
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), name
    assert packed.class_names == plain.class_names


def test_plain_file_and_gz_may_be_mixed(tmp_path):
    make_fake_mnist(tmp_path)
    gzip_in_place(tmp_path / "MNIST" / "raw" / "train-images-idx3-ubyte")
    data = load_official_splits("mnist", tmp_path)
    assert data.train_images.shape == (40, 1, 28, 28)


def test_corrupt_gz_is_a_data_error_naming_the_file(tmp_path):
    make_fake_mnist(tmp_path)
    raw = tmp_path / "MNIST" / "raw"
    (raw / "train-labels-idx1-ubyte").unlink()
    (raw / "train-labels-idx1-ubyte.gz").write_bytes(b"\x1f\x8b\x08\x00not really gzip")
    with pytest.raises(DataError, match=r"train-labels-idx1-ubyte\.gz: corrupt gzip file"):
        load_official_splits("mnist", tmp_path)


def test_truncated_gz_is_a_data_error_naming_the_file(tmp_path):
    make_fake_mnist(tmp_path)
    path = tmp_path / "MNIST" / "raw" / "t10k-images-idx3-ubyte"
    gzip_in_place(path)
    gz = path.with_name(path.name + ".gz")
    gz.write_bytes(gz.read_bytes()[:-30])
    with pytest.raises(DataError, match=r"t10k-images-idx3-ubyte\.gz: corrupt gzip file"):
        load_official_splits("mnist", tmp_path)


def test_gz_holding_a_wrong_idx_is_a_corrupt_idx_file(tmp_path):
    make_fake_mnist(tmp_path)
    path = tmp_path / "MNIST" / "raw" / "train-images-idx3-ubyte"
    path.unlink()
    path.with_name(path.name + ".gz").write_bytes(gzip.compress(b"\x00\x00\x08\x03" + b"\x00" * 5))
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte\.gz: corrupt idx file"):
        load_official_splits("mnist", tmp_path)


def test_missing_raw_file_names_both_acceptable_names(tmp_path):
    make_fake_mnist(tmp_path)
    (tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte \(or t10k-labels-idx1-ubyte\.gz\): raw mnist file "
                                        r"missing"):
        load_official_splits("mnist", tmp_path)


def test_truncated_idx_data_is_a_corrupt_idx_file(tmp_path):
    make_fake_mnist(tmp_path)
    path = tmp_path / "MNIST" / "raw" / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte: corrupt idx file \(.*bytes of data"):
        load_official_splits("mnist", tmp_path)


@pytest.mark.skipif(not (QUALITY / "FashionMNIST" / "raw").is_dir(),
                    reason=f"{QUALITY}/FashionMNIST/raw absent (the shared quality data sets)")
def test_the_official_fashion_mnist_gz_files_load():
    data = load_official_splits("fashion_mnist", QUALITY)
    assert data.train_images.shape == (60000, 1, 28, 28) and data.test_images.shape == (10000, 1, 28, 28)
    assert data.train_images.dtype == np.uint8 and data.train_labels.dtype == np.int64
    assert np.bincount(data.train_labels).tolist() == [6000] * 10
    assert np.bincount(data.test_labels).tolist() == [1000] * 10


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
