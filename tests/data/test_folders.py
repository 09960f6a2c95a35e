"""User image folders through prepare: photos of every size and encoding, split folders, skipped and unreadable
files, paired image/mask folders; read back from the prepared files."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import tifffile
from PIL import Image

from stages.prepare import main as prepare_main
from tests.data.factories import make_image_folder, make_paired_folders, make_photo_folder, save_png, write_params
from trainlab.core.cli import run_cli
from trainlab.core.config import Params
from trainlab.core.errors import DataError
from trainlab.data.bad_files import BAD_FILES_SHOWN, BadFiles
from trainlab.data.folders import AUTO_PHOTO_SIZE, index_image_folder
from trainlab.data.inputs import ImageInput
from trainlab.data.prepared import SPLITS, load_meta, load_split, split_files
from trainlab.data.preprocessing import CROP, ImagePolicy, load_preprocessing
from trainlab.data.writing import write_labeled_files
from trainlab.jobs.prepare import prepare_classification, prepare_segmentation


def params_for(classification: dict | None = None, segmentation: dict | None = None, **data) -> Params:
    section = {**data}
    if classification is not None:
        section["classification"] = {"source": "image_folder", **classification}
    if segmentation is not None:
        section["segmentation"] = {"source": "paired_folders", "num_classes": 3, **segmentation}
    return Params.model_validate({"base": {"seed": 7}, "data": section, "tracking": {"enabled": False}})


def prepare_images(tmp_path, root, workers=None, bad_images="error", **classification):
    folder = tmp_path / "prepared"
    params = params_for({"root": str(root), **classification}, bad_images=bad_images)
    stats = prepare_classification(params, folder, False, lambda message: None, workers)
    return {s: load_split(folder, s) for s in SPLITS}, load_meta(folder), stats


def prepare_masks(tmp_path, root, **segmentation):
    folder = tmp_path / "prepared_seg"
    stats = prepare_segmentation(params_for(segmentation={"root": str(root), **segmentation}), folder,
                                 lambda message: None)
    return {s: load_split(folder, s) for s in SPLITS}, load_meta(folder), stats


def all_labels(splits) -> list[int]:
    return sorted(int(v) for s in SPLITS for v in splits[s]["labels"])


# --- class folders ---------------------------------------------------------------------------------------------------

def test_labels_follow_sorted_folder_names(tmp_path):
    splits, meta, _ = prepare_images(tmp_path, make_image_folder(tmp_path / "cls", ("dog", "cat"), per_class=5,
                                                                 size=8))
    assert meta["class_names"] == ["cat", "dog"] and all_labels(splits) == [0] * 5 + [1] * 5
    assert splits["train"]["images"].shape[1:] == (3, 8, 8)  # one small shared size: kept as it is
    # small colour images of one size (icons, digits as RGB PNGs) are not taken for photos: no crop or mirror
    assert meta["augment"] == "shift" and meta["hflip"] is False
    assert meta["auto"]["hflip"]["value"] is False and "one size" in meta["auto"]["augment"]["why"]


def test_a_folder_of_gray_digits_gets_no_mirror_and_no_photo_crops(tmp_path):
    from trainlab.data.embedded import load_mnist_5k

    digits, labels = load_mnist_5k()
    for i in range(40):
        save_png(tmp_path / "digits" / str(labels[i]) / f"{i}.png", digits[i])
    splits, meta, _ = prepare_images(tmp_path, tmp_path / "digits")
    assert meta["augment"] == "shift" and meta["hflip"] is False
    assert "gray" in meta["auto"]["augment"]["why"] and meta["auto"]["image_size"]["value"] == 28
    assert splits["train"]["images"].shape[1:] == (1, 28, 28)


def test_gray_and_rgb_images_mix_into_rgb(tmp_path):
    for name in ("a", "b"):
        for i in range(4):
            save_png(tmp_path / "raw" / name / f"gray{i}.png", np.full((4, 4), 9 + i, np.uint8))
        save_png(tmp_path / "raw" / name / "rgb.png", np.zeros((4, 4, 3), np.uint8))
    splits, meta, _ = prepare_images(tmp_path, tmp_path / "raw")
    assert meta["channels"] == 3 and splits["train"]["images"].shape[1] == 3


def test_photos_of_every_size_and_encoding_prepare_at_the_image_size(tmp_path):
    root = make_photo_folder(tmp_path / "photos", per_class=20)
    sizes = {Image.open(p).size for p in root.rglob("*.*")}
    assert len(sizes) > 20  # really of many sizes
    splits, meta, stats = prepare_images(tmp_path, root)
    size = AUTO_PHOTO_SIZE
    assert meta["height"] == meta["width"] == size and meta["channels"] == 3
    # the size is kept once, in preprocessing.json (load_meta reads it from there), not repeated in meta.json
    assert not {"channels", "height", "width"} & set(json.loads((tmp_path / "prepared" / "meta.json").read_text()))
    assert meta["augment"] == "photo" and meta["hflip"] is True and "photos" in meta["auto"]["augment"]["why"]
    assert sum(len(splits[s]["labels"]) for s in SPLITS) == 40
    assert stats["resize"]["resize"] == CROP and stats["files"]["image_files"] == 40
    assert load_preprocessing(tmp_path / "prepared")["image"] == ImagePolicy(3, size, size, CROP).to_dict()
    splits, meta, _ = prepare_images(tmp_path, root, image_size=40)
    assert splits["test"]["images"].shape[1:] == (3, 40, 40)


def test_hidden_and_non_image_files_are_skipped_and_counted(tmp_path):
    root = make_image_folder(tmp_path / "raw", ("a", "b"), per_class=5)
    (root / "a" / ".DS_Store").write_bytes(b"\0\0")
    (root / "a" / "._a_0.png").write_bytes(b"resource fork")
    (root / "b" / "notes.txt").write_text("taken on holiday")
    (root / "b" / "Thumbs.db").write_bytes(b"\0")
    (root / "README.md").write_text("my data")
    _, _, stats = prepare_images(tmp_path, root)
    assert stats["files"]["skipped_hidden"] == 2 and stats["files"]["skipped_not_image"] == 3
    assert stats["files"]["image_files"] == 10 and stats["files"]["unreadable"]["count"] == 0


# --- split folders ---------------------------------------------------------------------------------------------------

def split_tree(root, counts: dict[str, int], classes=("a", "b")):
    for split, per_class in counts.items():
        make_image_folder(root / split, classes, per_class=per_class)
    return root


def test_train_val_test_folders_are_used_as_given(tmp_path):
    root = split_tree(tmp_path / "raw", {"train": 6, "val": 2, "test": 3})
    assert index_image_folder(root).layout == "train/val/test folders"
    splits, meta, _ = prepare_images(tmp_path, root)
    assert {s: len(splits[s]["labels"]) for s in SPLITS} == {"train": 12, "val": 4, "test": 6}
    assert meta["counts"]["total"] == 22


def test_train_and_val_folders_val_becomes_test(tmp_path):
    root = split_tree(tmp_path / "raw", {"train": 10, "val": 3})
    splits, _, _ = prepare_images(tmp_path, root)
    assert len(splits["test"]["labels"]) == 6  # val/ is the held-out test split
    assert len(splits["train"]["labels"]) + len(splits["val"]["labels"]) == 20  # val drawn from train/
    assert len(splits["val"]["labels"]) == 2  # 10% of each class


def test_split_folders_with_different_classes_are_an_error(tmp_path):
    root = split_tree(tmp_path / "raw", {"train": 4})
    make_image_folder(root / "val", ("a", "c"), per_class=2)
    with pytest.raises(DataError, match=r"raw/val: lacks class\(es\) 'b' of train/ and has class\(es\) 'c' that "):
        prepare_images(tmp_path, root)


def test_an_empty_class_in_a_split_folder_is_named(tmp_path):
    root = split_tree(tmp_path / "raw", {"train": 4, "val": 2})
    for image in (root / "val" / "b").iterdir():
        image.unlink()
    with pytest.raises(DataError, match=r"val/b: class 'b' has no samples"):
        prepare_images(tmp_path, root)


def test_a_class_too_small_for_the_fractions_says_how_many_it_needs(tmp_path):
    root = make_image_folder(tmp_path / "raw", ("a", "b"), per_class=6)
    for image in sorted((root / "b").iterdir())[2:]:
        image.unlink()
    with pytest.raises(DataError, match=r"class 'b' has only 2 sample\(s\); each class needs at least 3"):
        prepare_images(tmp_path, root)


# --- unreadable files ------------------------------------------------------------------------------------------------

def break_files(root, count: int) -> list[str]:
    names = []
    for i in range(count):
        path = root / ("a" if i % 2 else "b") / f"broken_{i:02d}.jpg"
        path.write_bytes(b"" if i % 3 == 0 else b"\xff\xd8\xff\xe0 truncated jpeg")
        names.append(path.name)
    return names


def test_every_unreadable_file_is_named_exit_3_nothing_written(tmp_path, capsys):
    root = make_image_folder(tmp_path / "raw", ("a", "b"), per_class=6)
    good = root / "a" / "a_0.png"
    good.write_bytes(good.read_bytes()[:70])  # truncated PNG: its header reads, its pixels do not
    names = break_files(root, 3) + ["a_0.png"]
    params = write_params(tmp_path / "params.yaml", {"classification": {"source": "image_folder", "root": str(root)}})
    out, stats = tmp_path / "out" / "prepared", tmp_path / "out" / "stats.json"
    argv = [str(out), str(stats), "--params", str(params)]
    with pytest.raises(SystemExit) as exit_info:
        run_cli(prepare_main, argv)
    assert exit_info.value.code == DataError.exit_code == 3
    message = capsys.readouterr().err
    assert "4 unreadable image file(s):" in message and "data.bad_images: skip" in message
    assert all(name in message for name in names)
    assert not out.exists() and not stats.exists() and list((tmp_path / "out").iterdir()) == []


def test_more_bad_files_than_shown_stop_early(tmp_path):
    root = make_image_folder(tmp_path / "raw", ("a", "b"), per_class=3)
    break_files(root, BAD_FILES_SHOWN + 5)
    with pytest.raises(DataError, match=f"more than {BAD_FILES_SHOWN} unreadable") as error:
        prepare_images(tmp_path, root)
    listed = [line for line in str(error.value).splitlines() if line.startswith("  /")]
    assert len(listed) == BAD_FILES_SHOWN and all("broken_" in line for line in listed)


def test_skip_leaves_unreadable_files_out_and_lists_them(tmp_path):
    root = make_image_folder(tmp_path / "raw", ("a", "b"), per_class=8)
    names = break_files(root, 3)
    splits, _, stats = prepare_images(tmp_path, root, bad_images="skip")
    assert sum(len(splits[s]["labels"]) for s in SPLITS) == 16
    listed = stats["files"]["unreadable"]
    assert listed["count"] == 3 and sorted(f["path"].rsplit("/", 1)[1] for f in listed["files"]) == sorted(names)
    assert all("unreadable or corrupt image" in f["reason"] for f in listed["files"])


# --- the written bytes -----------------------------------------------------------------------------------------------

def digest(folder) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_shards_do_not_depend_on_the_decode_workers_and_read_back_whole(tmp_path):
    root = make_photo_folder(tmp_path / "photos", per_class=12)
    files = sorted(root.rglob("*.*"))
    labels = np.array([0 if p.parent.name == "china" else 1 for p in files], dtype=np.int64)
    policy = ImagePolicy(3, 32, 32, CROP)
    outputs = {}
    for workers, shard_bytes in ((1, 5 * 3200), (2, 5 * 3200), (2, 10**9)):
        folder = tmp_path / f"w{workers}_{shard_bytes}"
        folder.mkdir()
        write_labeled_files(folder, "train", files, labels, ImageInput(policy), BadFiles(), workers, shard_bytes)
        outputs[(workers, shard_bytes)] = folder
    small_1, small_2, whole = outputs.values()
    assert len(split_files(small_1, "train")) == 5 and digest(small_1) == digest(small_2)
    assert [p.name for p in split_files(whole, "train")] == ["train.safetensors"]
    sharded, single = load_split(small_1, "train"), load_split(whole, "train")
    assert all(np.array_equal(sharded[k].numpy(), single[k].numpy()) for k in ("images", "labels"))


# --- paired image/mask folders ---------------------------------------------------------------------------------------

def test_paired_png_folders(tmp_path):
    splits, meta, stats = prepare_masks(tmp_path, make_paired_folders(tmp_path / "seg", count=10, size=16))
    assert splits["train"]["images"].shape[1:] == (1, 16, 16) and splits["train"]["masks"].dtype.is_floating_point \
        is False
    assert meta["class_names"] == ["background", "class_1", "class_2"]
    assert sum(stats["pixel_fraction"]["train"].values()) == pytest.approx(1.0, abs=1e-5)


def test_images_of_varying_sizes_are_stretched_masks_keep_their_classes(tmp_path):
    rng = np.random.default_rng(0)
    root = tmp_path / "seg"
    for i, (h, w) in enumerate([(300, 400), (260, 500), (320, 320), (280, 420), (310, 360)] * 2):
        save_png(root / "images" / f"p{i}.png", rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        mask = np.zeros((h, w), np.uint8)
        mask[h // 4:h // 2, w // 4:w // 2], mask[-h // 3:, -w // 3:] = 1, 2
        save_png(root / "masks" / f"p{i}.png", mask)
    splits, meta, _ = prepare_masks(tmp_path, root)
    assert (meta["height"], meta["width"]) == (400, 400)  # the median longer side
    assert "stretched" in meta["auto"]["image_size"]["why"]
    masks = np.concatenate([splits[s]["masks"].numpy() for s in SPLITS])
    assert set(np.unique(masks).tolist()) == {0, 1, 2}
    splits, meta, _ = prepare_masks(tmp_path, root, image_size=48)
    assert splits["val"]["images"].shape[1:] == (3, 48, 48) and splits["val"]["masks"].shape[1:] == (48, 48)


def test_images_of_one_large_size_keep_their_own_resolution(tmp_path):
    rng = np.random.default_rng(0)
    root = tmp_path / "seg"
    for i in range(10):
        save_png(root / "images" / f"p{i}.png", rng.integers(0, 256, (300, 420), dtype=np.uint8))
        mask = np.zeros((300, 420), np.uint8)
        mask[::7, :], mask[:, ::9] = 1, 2  # one-pixel lines: what a resize would erase
        save_png(root / "masks" / f"p{i}.png", mask)
    splits, meta, _ = prepare_masks(tmp_path, root)
    assert (meta["height"], meta["width"]) == (300, 420)
    assert meta["auto"]["image_size"] == {"value": "300x420",
                                          "why": "kept at their own resolution: every image is 300x420"}
    assert np.array_equal(splits["train"]["masks"][0].numpy() == 1, np.isin(np.arange(300), range(0, 300, 7))[:, None]
                          & (np.arange(420) % 9 != 0)[None, :])


def test_jpeg_images_with_tiff_masks(tmp_path):
    mask = np.zeros((10, 12), np.uint16)
    mask[2:5, 3:6], mask[6:, :4] = 1, 2
    for i in range(10):
        (tmp_path / "seg" / "images").mkdir(parents=True, exist_ok=True)
        (tmp_path / "seg" / "masks").mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((10, 12, 3), 100 + i, np.uint8)).save(tmp_path / "seg" / "images" / f"s{i}.jpg")
        tifffile.imwrite(tmp_path / "seg" / "masks" / f"s{i}.tif", mask)
    splits, _, _ = prepare_masks(tmp_path, tmp_path / "seg")
    assert splits["train"]["images"].shape[1:] == (3, 10, 12) and int(splits["train"]["masks"].max()) == 2


def test_palette_png_masks_keep_their_indices(tmp_path):
    root = make_paired_folders(tmp_path / "seg", count=10)
    for path in (root / "masks").iterdir():
        indices = np.asarray(Image.open(path))
        mask = Image.fromarray(indices, mode="P")
        mask.putpalette([0, 0, 0, 255, 0, 0, 0, 255, 0])
        mask.save(path)
    splits, _, _ = prepare_masks(tmp_path, root)
    assert sorted(np.unique(splits["train"]["masks"].numpy()).tolist()) == [0, 1, 2]


def test_binary_0_255_masks_become_0_1(tmp_path):
    root = tmp_path / "seg"
    for i in range(10):
        save_png(root / "images" / f"x{i}.png", np.zeros((6, 6), np.uint8))
        mask = np.zeros((6, 6), np.uint8)
        mask[1:3] = 255
        save_png(root / "masks" / f"x{i}.png", mask)
    splits, meta, _ = prepare_masks(tmp_path, root, num_classes=2)
    assert int(splits["train"]["masks"].max()) == 1 and meta["class_names"] == ["background", "foreground"]


def test_0_255_masks_with_many_classes_say_how_to_fix(tmp_path):
    root = make_paired_folders(tmp_path / "seg", count=10)
    save_png(root / "masks" / "img_03.png", np.full((16, 16), 255, np.uint8))
    with pytest.raises(DataError,
                       match=r"img_03\.png: mask values \[255\] outside the classes 0\.\.10.*num_classes: 2"):
        prepare_masks(tmp_path, root, num_classes=11)


def test_class_names_file(tmp_path):
    root = make_paired_folders(tmp_path / "seg", count=10)
    (root / "classes.txt").write_text("sky\nroad\ncar\n")
    assert prepare_masks(tmp_path, root)[1]["class_names"] == ["sky", "road", "car"]


@pytest.mark.parametrize("remove, expected", [
    ("masks/img_01.png", r"images/img_01\.png: no mask with stem 'img_01'"),
    ("images/img_02.png", r"masks/img_02\.png: no image with stem 'img_02'"),
])
def test_unpaired_files_are_named(tmp_path, remove, expected):
    root = make_paired_folders(tmp_path / "seg", count=10)
    (root / remove).unlink()
    with pytest.raises(DataError, match=expected):
        prepare_masks(tmp_path, root)


def test_colour_mask_is_rejected(tmp_path):
    root = make_paired_folders(tmp_path / "seg", count=10)
    colours = np.zeros((16, 16, 3), np.uint8)
    colours[:, :, 1] = 1
    save_png(root / "masks" / "img_04.png", colours)
    with pytest.raises(DataError, match=r"masks/img_04\.png: colour mask"):
        prepare_masks(tmp_path, root)


def test_data_stats_json_holds_the_folder_record(tmp_path):
    root = make_image_folder(tmp_path / "raw", ("a", "b"), per_class=5)
    (root / "a" / "notes.txt").write_text("x")
    params = write_params(tmp_path / "params.yaml", {"classification": {"source": "image_folder", "root": str(root)}})
    out, stats_file = tmp_path / "out" / "prepared", tmp_path / "out" / "stats.json"
    prepare_main([str(out), str(stats_file), "--params", str(params)])
    record = json.loads(stats_file.read_text())["classification"]
    assert record["files"]["skipped_not_image"] == 1 and record["resize"]["resize"] == "none"
