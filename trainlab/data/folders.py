"""User image folders, indexed without decoding: one folder per class (flat, or under train/val/test split folders)
and paired image/mask folders (segmentation); and the resize policy their files call for."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trainlab.core import auto
from trainlab.core.auto import AUTO_KEEP_MAX, AUTO_PHOTO_SIZE, AUTO_SEGMENTATION_MAX  # noqa: F401 - re-exported
from trainlab.core.errors import DataError
from trainlab.data.bad_files import BadFiles
from trainlab.data.images import Probe, probe_image
from trainlab.data.input_files import IMAGE_KINDS, FolderListing, list_images, require_folder
from trainlab.data.ordered_map import map_in_order
from trainlab.data.preprocessing import CROP, KEEP, STRETCH, ImagePolicy

IMAGES_DIR = "images"
MASKS_DIR = "masks"
CLASS_NAMES_FILE = "classes.txt"
SPLIT_FOLDERS = ("train", "val", "test")
FLAT = "all"  # the one "split" of a folder without split folders



@dataclass
class ClassFiles:
    """Image files per split with int64 labels indexing `class_names`; the split is FLAT when the folder gives none.
    `skipped`: hidden and non-image files met (never read)."""

    files: dict[str, list[Path]]
    labels: dict[str, np.ndarray]
    class_names: list[str]
    layout: str
    skipped: FolderListing = field(default_factory=FolderListing)


@dataclass
class PairFiles:
    """(image, mask) file pairs matched by stem, and the class names."""

    pairs: list[tuple[Path, Path]]
    class_names: list[str]
    skipped: FolderListing = field(default_factory=FolderListing)


def visible_folders(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def loose_files(root: Path) -> FolderListing:
    """Files lying beside the class folders (a README, .DS_Store): counted as skipped."""
    listing = list_images(root)
    return FolderListing([], listing.hidden, listing.not_images + listing.files)


def index_image_folder(root: str | Path) -> ClassFiles:
    """``<root>/<class>/<image>``, or ``<root>/{train,val,test}/<class>/<image>`` (train required; the split folders
    must hold the same classes). Class names are the folder names, sorted; an empty class is an error."""
    root = Path(root)
    require_folder(root, "image-folder dataset (data.classification.root)")
    subfolders = visible_folders(root)
    names = {p.name for p in subfolders}
    skipped = loose_files(root)
    if "train" in names and names <= set(SPLIT_FOLDERS):
        splits = [s for s in SPLIT_FOLDERS if s in names]
        per_split = {s: class_files(root / s, skipped) for s in splits}
        require_same_classes(root, per_split)
        layout = "/".join(splits) + " folders"
    else:
        per_split = {FLAT: class_files(root, skipped, subfolders)}
        layout = "class folders"
    class_names = next(iter(per_split.values()))[2]
    return ClassFiles({s: f for s, (f, _, _) in per_split.items()}, {s: lab for s, (_, lab, _) in per_split.items()},
                      class_names, layout, skipped)


def class_files(folder: Path, skipped: FolderListing,
                folders: list[Path] | None = None) -> tuple[list[Path], np.ndarray, list[str]]:
    """The image files of every class folder under `folder`, their labels and the class names."""
    folders = visible_folders(folder) if folders is None else folders
    if not folders:
        raise DataError(f"{folder}: no class folders; expected {folder}/<class name>/<image files>")
    files: list[Path] = []
    labels: list[int] = []
    for label, class_folder in enumerate(folders):
        listing = list_images(class_folder)
        skipped.add(FolderListing([], listing.hidden, listing.not_images))
        if not listing.files:
            raise DataError(f"{class_folder}: class {class_folder.name!r} has no samples (no image files: "
                            f"{IMAGE_KINDS})")
        files += listing.files
        labels += [label] * len(listing.files)
    return files, np.array(labels, dtype=np.int64), [f.name for f in folders]


def require_same_classes(root: Path, per_split: dict[str, tuple[list[Path], np.ndarray, list[str]]]) -> None:
    train = per_split["train"][2]
    for split, (_, _, names) in per_split.items():
        missing = [n for n in train if n not in names]
        extra = [n for n in names if n not in train]
        if missing or extra:
            parts = ([f"lacks class(es) {', '.join(map(repr, missing))} of train/"] if missing else []) + \
                    ([f"has class(es) {', '.join(map(repr, extra))} that train/ lacks"] if extra else [])
            raise DataError(f"{root / split}: {' and '.join(parts)}; every split folder must hold the same class "
                            "folders")


def files_by_stem(folder: Path, skipped: FolderListing) -> dict[str, Path]:
    """Image files of a folder keyed by file stem; two files with one stem are an error."""
    by_stem: dict[str, Path] = {}
    listing = list_images(folder)
    skipped.add(FolderListing([], listing.hidden, listing.not_images))
    for path in listing.files:
        if path.stem in by_stem:
            raise DataError(f"{path}: same file stem as {by_stem[path.stem]}; images and masks are matched by stem")
        by_stem[path.stem] = path
    return by_stem


def index_paired_folders(root: str | Path, num_classes: int) -> PairFiles:
    """``<root>/images/<stem>.*`` with ``<root>/masks/<stem>.*``; an image without a mask (or the reverse) is an
    error naming it."""
    root = Path(root)
    require_folder(root, "paired-folders dataset (data.segmentation.root)")
    skipped = FolderListing()
    images = files_by_stem(require_folder(root / IMAGES_DIR, "images"), skipped)
    masks = files_by_stem(require_folder(root / MASKS_DIR, "masks"), skipped)
    for stem, path in images.items():
        if stem not in masks:
            raise DataError(f"{path}: no mask with stem {stem!r} in {root / MASKS_DIR}")
    for stem, path in masks.items():
        if stem not in images:
            raise DataError(f"{path}: no image with stem {stem!r} in {root / IMAGES_DIR}")
    if not images:
        raise DataError(f"{root / IMAGES_DIR}: no image files ({IMAGE_KINDS})")
    pairs = [(images[stem], masks[stem]) for stem in sorted(images)]
    return PairFiles(pairs, segmentation_class_names(root, num_classes), skipped)


def segmentation_class_names(root: Path, num_classes: int) -> list[str]:
    """Names from ``<root>/classes.txt`` (one per line) if present, else background/foreground or class_<i>."""
    names_file = root / CLASS_NAMES_FILE
    if names_file.is_file():
        names = [line.strip() for line in names_file.read_text().splitlines() if line.strip()]
        if len(names) != num_classes:
            raise DataError(f"{names_file}: {len(names)} class names, "
                            f"but data.segmentation.num_classes is {num_classes}")
        return names
    if num_classes == 2:
        return ["background", "foreground"]
    return ["background", *(f"class_{i}" for i in range(1, num_classes))]


def probe_files(paths: Sequence[Path], bad: BadFiles, workers: int | None = None) -> dict[Path, Probe]:
    """Each readable file's header (channels, upright size); the unreadable ones go to `bad`."""
    probes: dict[Path, Probe] = {}
    for path, result in map_in_order(paths, probe_image, workers):
        if isinstance(result, DataError):
            bad.add(result, path)
        else:
            probes[path] = result
    return probes


def choose_policy(probes: Sequence[Probe], image_size: int | str, task: str, key: str) -> tuple[ImagePolicy, str]:
    """The resize policy for files with these headers, and why: gray when every file is gray, else RGB; `image_size`
    auto as trainlab.core.auto.image_size says; a number resizes to it (classification: shorter side, then
    the centre square; segmentation: the whole image stretched)."""
    if not probes:
        raise DataError(f"{key}: no readable image files")
    channels = 3 if any(p.channels == 3 for p in probes) else 1
    sizes = {(p.height, p.width) for p in probes}
    resize = CROP if task == "classifier" else STRETCH
    height, width, keep, why = auto.image_size(image_size, task, sizes, [max(p.height, p.width) for p in probes])
    return ImagePolicy(channels, height, width, KEEP if keep else resize), why


def image_kind(probes: Sequence[Probe]) -> tuple[str, str]:
    """"photo" or "fixed" and why: colour images of varied sizes, or larger than AUTO_KEEP_MAX a side, are photos
    (mirrors and random resized crops keep their labels); gray images, and small images of one size (digits,
    letters, scans, icons), are not, and get no augmentation that could change a label."""
    channels = 3 if any(p.channels == 3 for p in probes) else 1
    sizes = {(p.height, p.width) for p in probes}
    largest = max(max(size) for size in sizes)
    if channels == 1:
        return "fixed", "gray images (digits, letters or scans: a mirror or a heavy crop can change the class)"
    if len(sizes) == 1 and largest <= AUTO_KEEP_MAX:
        return "fixed", f"colour images all {next(iter(sizes))[0]}x{next(iter(sizes))[1]} (small and of one size)"
    return "photo", (f"colour images of {len(sizes):,} sizes" if len(sizes) > 1
                     else f"colour images of {largest} px") + " (photos)"
