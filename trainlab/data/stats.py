"""Dataset statistics (samples per split and class, image sizes, mask pixels, token lengths) for DVC and MLflow."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

DECIMALS = 6


def rounded(value: float) -> float:
    return round(float(value), DECIMALS)


def sample_counts(sizes: Mapping[str, int]) -> dict[str, int]:
    """Samples per split plus the total."""
    counts = {split: int(n) for split, n in sizes.items()}
    return {**counts, "total": sum(counts.values())}


def class_counts(labels: np.ndarray, class_names: Sequence[str]) -> dict[str, int]:
    """Samples per class name."""
    counts = np.bincount(np.asarray(labels, dtype=np.int64), minlength=len(class_names))
    return {name: int(n) for name, n in zip(class_names, counts)}


def pixel_fractions(masks: np.ndarray, class_names: Sequence[str]) -> dict[str, float]:
    """Fraction of mask pixels per class."""
    return pixel_fractions_from_counts(np.bincount(masks.ravel(), minlength=len(class_names)), class_names)


def pixel_fractions_from_counts(counts: np.ndarray, class_names: Sequence[str]) -> dict[str, float]:
    """Fraction of mask pixels per class, from pixel counts per class."""
    counts = np.asarray(counts)[:len(class_names)]
    total = max(int(counts.sum()), 1)
    return {name: rounded(n / total) for name, n in zip(class_names, counts)}


def token_lengths(lengths: np.ndarray, max_length: int) -> dict[str, float]:
    """Distribution of full token lengths ([CLS] included) and the fraction cut at max_length."""
    if lengths.size == 0:
        return {"mean": 0.0, "p50": 0.0, "p95": 0.0, "max": 0, "truncated_fraction": 0.0}
    return {
        "mean": rounded(lengths.mean()),
        "p50": rounded(np.percentile(lengths, 50)),
        "p95": rounded(np.percentile(lengths, 95)),
        "max": int(lengths.max()),
        "truncated_fraction": rounded((lengths > max_length).mean()),
    }


def image_size(images: np.ndarray) -> dict[str, int]:
    """channels, height and width of a (N, C, H, W) array."""
    _, channels, height, width = images.shape
    return {"channels": int(channels), "height": int(height), "width": int(width)}
