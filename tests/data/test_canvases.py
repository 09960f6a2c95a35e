"""Segmentation canvases: deterministic, masks from the strokes, digits only from the given pool."""

import numpy as np
import pytest

from trainlab.data import canvases
from trainlab.data.embedded import load_mnist_5k


@pytest.fixture(scope="module")
def mnist():
    return load_mnist_5k()


def compose(mnist, pool, count=40, size=64, max_digits=3, seed=0):
    digits, labels = mnist
    return canvases.compose_canvases(digits, labels, pool, count, size, max_digits, np.random.default_rng(seed))


def test_same_seed_gives_identical_canvases(mnist):
    pool = np.arange(100)
    a, b = compose(mnist, pool), compose(mnist, pool)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[0], compose(mnist, pool, seed=1)[0])


def test_shapes_dtypes_and_digit_counts(mnist):
    images, masks, placed = compose(mnist, np.arange(100), count=40, size=48, max_digits=3)
    assert images.shape == (40, 1, 48, 48) and images.dtype == np.uint8
    assert masks.shape == (40, 48, 48) and masks.dtype == np.uint8
    assert placed.min() >= 1 and placed.max() <= 3 and len(set(placed.tolist())) > 1


def test_masks_mark_the_strokes_of_the_pool_digits_only(mnist):
    digits, labels = mnist
    pool = np.flatnonzero(labels == 7)[:20]
    images, masks, _ = compose(mnist, pool)
    assert set(np.unique(masks).tolist()) == {0, 8}  # background and digit 7 -> class 8
    strokes = images[:, 0] >= canvases.STROKE_THRESHOLD
    assert np.array_equal(masks > 0, strokes)


def test_canvas_pixels_come_from_the_pool_digits(mnist):
    digits, labels = mnist
    pool = np.array([0, 600, 1200])
    images, _, _ = compose(mnist, pool, count=10)
    assert set(np.unique(images).tolist()) <= set(np.unique(digits[pool]).tolist())


def test_digits_that_find_no_room_are_left_out(mnist):
    _, _, placed = compose(mnist, np.arange(50), count=20, size=28, max_digits=4)
    assert placed.tolist() == [1] * 20


def test_canvas_count_follows_canvases_per_digit():
    assert canvases.canvas_count(350, 1.0) == 350
    assert canvases.canvas_count(350, 0.5) == 175
    assert canvases.canvas_count(1, 0.1) == 1
