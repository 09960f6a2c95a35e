"""User image data: one folder per class, and paired image/mask folders in PNG, JPEG and TIFF."""

import numpy as np
import pytest
import tifffile
from PIL import Image

from tests.data.factories import make_image_folder, make_paired_folders, save_png
from trainlab.data.folders import load_image_folder, load_paired_folders
from trainlab.core.errors import DataError


def test_image_folder_labels_follow_sorted_folder_names(tmp_path):
    data = load_image_folder(make_image_folder(tmp_path / "cls", classes=("dog", "cat"), per_class=3, size=8))
    assert data.class_names == ["cat", "dog"]
    assert data.images.shape == (6, 3, 8, 8) and data.images.dtype == np.uint8
    assert data.labels.tolist() == [0, 0, 0, 1, 1, 1]


def test_gray_and_rgb_images_mix_into_rgb(tmp_path):
    save_png(tmp_path / "a" / "gray.png", np.full((4, 4), 9, np.uint8))
    save_png(tmp_path / "b" / "rgb.png", np.zeros((4, 4, 3), np.uint8))
    data = load_image_folder(tmp_path)
    assert data.images.shape == (2, 3, 4, 4) and data.images[0].min() == 9


def test_paired_png_folders(tmp_path):
    data = load_paired_folders(make_paired_folders(tmp_path, count=4, size=16, num_classes=3), num_classes=3)
    assert data.images.shape == (4, 1, 16, 16) and data.masks.shape == (4, 16, 16)
    assert data.masks.dtype == np.uint8 and set(np.unique(data.masks).tolist()) == {0, 1, 2}
    assert data.class_names == ["background", "class_1", "class_2"]


def test_jpeg_images_with_tiff_masks(tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "masks").mkdir()
    mask = np.zeros((10, 12), np.uint16)
    mask[2:5, 3:6] = 4
    for i in range(2):
        Image.fromarray(np.full((10, 12, 3), 100 + i, np.uint8)).save(tmp_path / "images" / f"s{i}.jpg")
        tifffile.imwrite(tmp_path / "masks" / f"s{i}.tif", mask)
    data = load_paired_folders(tmp_path, num_classes=5)
    assert data.images.shape == (2, 3, 10, 12) and data.masks.shape == (2, 10, 12)
    assert data.masks.max() == 4


def test_palette_png_masks_keep_their_indices(tmp_path):
    save_png(tmp_path / "images" / "x.png", np.zeros((4, 4, 3), np.uint8))
    mask = Image.fromarray(np.array([[0, 1], [2, 0]], np.uint8).repeat(2, 0).repeat(2, 1), mode="P")
    mask.putpalette([0, 0, 0, 255, 0, 0, 0, 255, 0])
    (tmp_path / "masks").mkdir()
    mask.save(tmp_path / "masks" / "x.png")
    assert sorted(np.unique(load_paired_folders(tmp_path, num_classes=3).masks).tolist()) == [0, 1, 2]


def test_binary_0_255_masks_become_0_1(tmp_path):
    save_png(tmp_path / "images" / "x.png", np.zeros((6, 6), np.uint8))
    mask = np.zeros((6, 6), np.uint8)
    mask[1:3] = 255
    save_png(tmp_path / "masks" / "x.png", mask)
    data = load_paired_folders(tmp_path, num_classes=2)
    assert data.masks.max() == 1 and data.masks.sum() == 12
    assert data.class_names == ["background", "foreground"]


def test_0_255_masks_with_many_classes_say_how_to_fix(tmp_path):
    save_png(tmp_path / "images" / "x.png", np.zeros((6, 6), np.uint8))
    save_png(tmp_path / "masks" / "x.png", np.full((6, 6), 255, np.uint8))
    with pytest.raises(DataError, match=r"x\.png: mask values \[255\] outside the classes 0\.\.10.*num_classes: 2"):
        load_paired_folders(tmp_path, num_classes=11)


def test_class_names_file(tmp_path):
    make_paired_folders(tmp_path, count=2, num_classes=3)
    (tmp_path / "classes.txt").write_text("sky\nroad\ncar\n")
    assert load_paired_folders(tmp_path, num_classes=3).class_names == ["sky", "road", "car"]


def test_image_without_mask_is_named(tmp_path):
    make_paired_folders(tmp_path, count=3)
    (tmp_path / "masks" / "img_01.png").unlink()
    with pytest.raises(DataError, match=r"images/img_01\.png: no mask with stem 'img_01'"):
        load_paired_folders(tmp_path, num_classes=3)


def test_mask_without_image_is_named(tmp_path):
    make_paired_folders(tmp_path, count=3)
    (tmp_path / "images" / "img_02.png").unlink()
    with pytest.raises(DataError, match=r"masks/img_02\.png: no image with stem 'img_02'"):
        load_paired_folders(tmp_path, num_classes=3)


def test_images_of_different_sizes_are_named(tmp_path):
    make_image_folder(tmp_path, classes=("a", "b"), per_class=2, size=8)
    save_png(tmp_path / "b" / "big.png", np.zeros((9, 8, 3), np.uint8))
    with pytest.raises(DataError, match=r"b/big\.png: image size 8x9 \(WxH\) differs"):
        load_image_folder(tmp_path)


def test_colour_mask_is_rejected(tmp_path):
    save_png(tmp_path / "images" / "x.png", np.zeros((4, 4), np.uint8))
    colours = np.zeros((4, 4, 3), np.uint8)
    colours[:, :, 1] = 1
    save_png(tmp_path / "masks" / "x.png", colours)
    with pytest.raises(DataError, match=r"masks/x\.png: colour mask"):
        load_paired_folders(tmp_path, num_classes=3)
