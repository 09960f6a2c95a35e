"""Deterministic stratified train/val/test splits drawn from the base seed."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from trainlab.core.errors import DataError
from trainlab.core.repro import derived_seed


def split_rng(seed: int, *keys: str) -> np.random.Generator:
    """A NumPy generator for one named sub-stream of the base seed."""
    return np.random.default_rng(derived_seed(seed, *keys))


def held_out_sizes(n: int, fractions: dict[str, float]) -> dict[str, int]:
    """Per held-out split: round(n * fraction), at least one sample each."""
    return {split: max(1, round(n * fraction)) for split, fraction in fractions.items()}


def stratified_split(labels: np.ndarray, fractions: dict[str, float], seed: int, key: str,
                     class_names: Sequence[str] | None = None, what: str = "data") -> dict[str, np.ndarray]:
    """Split indices per class: each held-out split gets its fraction of every class, the rest is "train".

    `fractions` names the held-out splits in the order they are drawn (e.g. {"test": 0.2, "val": 0.1}).
    Within each split the indices are shuffled (seeded), so files are not ordered by class.
    """
    labels = np.asarray(labels)
    rng = split_rng(seed, "split", key)
    parts: dict[str, list[np.ndarray]] = {split: [] for split in ("train", *fractions)}
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        sizes = held_out_sizes(len(members), fractions)
        if sum(sizes.values()) >= len(members):
            name = class_names[label] if class_names is not None else str(label)
            raise DataError(f"{what}: class {name!r} has only {len(members)} sample(s); each class needs at least "
                            f"{sum(sizes.values()) + 1} to give every split ({', '.join(parts)}) one")
        start = 0
        for split, size in sizes.items():
            parts[split].append(members[start:start + size])
            start += size
        parts["train"].append(members[start:])
    return {split: rng.permutation(np.concatenate(chunks)) for split, chunks in parts.items()}


def train_val_test_split(labels: np.ndarray, val_fraction: float, test_fraction: float, seed: int, key: str,
                         class_names: Sequence[str] | None = None, what: str = "data") -> dict[str, np.ndarray]:
    """The standard three-way stratified split, returned in train/val/test order."""
    parts = stratified_split(labels, {"test": test_fraction, "val": val_fraction}, seed, key, class_names, what)
    return {split: parts[split] for split in ("train", "val", "test")}


def require_every_class(labels: np.ndarray, class_names: Sequence[str], what: str) -> np.ndarray:
    """Samples per class; a class with no samples is a DataError naming it."""
    counts = np.bincount(np.asarray(labels, dtype=np.int64), minlength=len(class_names))
    empty = [name for name, count in zip(class_names, counts) if count == 0]
    if empty:
        raise DataError(f"{what}: class(es) {', '.join(map(repr, empty))} have no samples; every class needs samples")
    return counts
