"""Prepared splits read lazily: columns read exactly what load_split reads, across shards, in any order."""

import numpy as np
import pytest
import torch

from trainlab.core.errors import DataError
from trainlab.data.prepared import ShardWriter, load_split, split_files
from trainlab.data.shards import ShardSplit, open_split


@pytest.fixture
def sharded(tmp_path):
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (23, 3, 5, 4), generator=g, dtype=torch.uint8)
    labels = torch.randint(0, 7, (23,), generator=g)
    writer = ShardWriter(tmp_path, "train", 3 * 5 * 4 + 8, shard_bytes=5 * 68)  # 5 samples a shard
    for start in range(0, 23, 7):
        writer.add({"images": images[start:start + 7], "labels": labels[start:start + 7]})
    assert writer.close() == 23
    return tmp_path, images, labels


def test_columns_read_what_load_split_reads(sharded):
    folder, images, labels = sharded
    assert len(split_files(folder, "train")) == 5
    assert torch.equal(load_split(folder, "train")["images"], images)
    split = ShardSplit(folder, "train")
    assert len(split) == 23 and split["images"].shape == images.shape and split["images"].dtype == torch.uint8
    assert split.nbytes == images.numel() + 8 * 23
    assert torch.equal(split["images"].load(), images) and torch.equal(split["labels"].load(), labels)


def test_rows_in_any_order_across_shards(sharded):
    folder, images, labels = sharded
    split = ShardSplit(folder, "train")
    rows = torch.tensor([22, 0, 4, 5, 6, 13, 12, 11, 3, 3])
    assert torch.equal(split["images"][rows], images[rows]) and torch.equal(split["labels"][rows], labels[rows])
    assert torch.equal(split["images"][3:9], images[3:9])
    view = split["labels"][1::3]  # a DDP rank's share: lazy until read
    assert len(view) == len(labels[1::3]) and torch.equal(view[torch.arange(len(view))], labels[1::3])
    assert int(split["labels"].min()) == int(labels.min()) and int(split["labels"].max()) == int(labels.max())


def test_open_split_streams_only_what_does_not_fit(sharded):
    folder, images, _ = sharded
    assert isinstance(open_split(folder, "train", max_in_memory_mb=1), dict)
    assert isinstance(open_split(folder, "train", max_in_memory_mb=0), ShardSplit)
    assert isinstance(open_split(folder, "train", max_in_memory_mb=0, streamable=False), dict)


def test_a_shard_shorter_than_its_header_is_named(sharded):
    folder, _, _ = sharded
    last = split_files(folder, "train")[-1]
    last.write_bytes(last.read_bytes()[:-10])
    split = ShardSplit(folder, "train")
    with pytest.raises(DataError, match=r"train-00004\.safetensors: not a readable safetensors file \(shorter"):
        split["images"][np.array([22])]
