"""The synthetic thin-structure set: deterministic, thin boundaries, darker than the cells, written as paired
folders."""

import numpy as np

from trainlab.data.folders import index_paired_folders
from trainlab.data.inputs import SegmentationInput
from trainlab.data.preprocessing import ImagePolicy
from trainlab.data.thin_structures import CLASS_NAMES, thin_structure_set, write_paired_folders


def test_same_seed_same_data_other_seed_other_data():
    a_img, a_mask = thin_structure_set(3, 64, seed=1)
    b_img, b_mask = thin_structure_set(3, 64, seed=1)
    c_img, _ = thin_structure_set(3, 64, seed=2)
    assert a_img.shape == (3, 1, 64, 64) and a_mask.shape == (3, 64, 64)
    assert a_img.dtype == np.uint8 and a_mask.dtype == np.uint8
    assert np.array_equal(a_img, b_img) and np.array_equal(a_mask, b_mask)
    assert not np.array_equal(a_img, c_img)


def test_boundaries_are_thin_and_darker_than_cells():
    images, masks = thin_structure_set(4, 128, seed=0)
    fraction = masks.mean()
    assert 0.03 < fraction < 0.25  # a network of thin lines, not blobs
    assert set(np.unique(masks)) == {0, 1}
    for image, mask in zip(images[:, 0].astype(float), masks.astype(bool)):
        assert image[mask].mean() < image[~mask].mean() - 10


def test_written_as_paired_folders_that_load_back(tmp_path):
    root = write_paired_folders(tmp_path / "cells", count=3, size=48, seed=0)
    index = index_paired_folders(root, num_classes=2)
    read = [SegmentationInput(ImagePolicy(1, 48, 48)).pair(image, mask, 2) for image, mask in index.pairs]
    images, masks = thin_structure_set(3, 48, seed=0)
    assert index.class_names == CLASS_NAMES
    assert np.array_equal(np.stack([i for i, _ in read]), images)
    assert np.array_equal(np.stack([m for _, m in read]), masks)
