"""Segmentation canvases composed from real MNIST digits, with masks taken from the digits' strokes.

Rules (deterministic from the seed):
- each canvas is ``canvas_size`` x ``canvas_size``, black, and gets 1..``max_digits`` digits (uniformly drawn);
- a digit is cropped to the bounding box of its inked pixels (intensity > 0) and placed at a random position
  where that box overlaps no other digit's box (up to PLACEMENT_TRIES tries; a digit that finds no room is left
  out, so every canvas holds at least one digit and no two digits ever share a pixel);
- mask: class ``digit + 1`` where the digit's intensity is >= STROKE_THRESHOLD (half of full ink), else 0
  (background), so the 11 classes are background and the digits 0..9;
- digits are drawn from one pool (a split's digits) in a seeded shuffled order, cycling through the pool, so
  canvases of a split only ever contain digits of that split.
"""

from __future__ import annotations

import numpy as np

STROKE_THRESHOLD = 128
PLACEMENT_TRIES = 50
CANVAS_CLASS_NAMES = ["background", *(str(d) for d in range(10))]


def ink_boxes(digits: np.ndarray) -> np.ndarray:
    """(N, 4) boxes (top, left, bottom, right), exclusive ends, around each digit's inked pixels."""
    inked = digits > 0
    rows, cols = inked.any(axis=2), inked.any(axis=1)
    top, left = rows.argmax(axis=1), cols.argmax(axis=1)
    bottom = rows.shape[1] - rows[:, ::-1].argmax(axis=1)
    right = cols.shape[1] - cols[:, ::-1].argmax(axis=1)
    return np.stack([top, left, bottom, right], axis=1)


def boxes_overlap(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def find_free_spot(rng: np.random.Generator, height: int, width: int, size: int,
                   taken: list[tuple[int, int, int, int]]) -> tuple[int, int, int, int] | None:
    """A random (top, left, bottom, right) box of the given size overlapping none of `taken`, or None."""
    for _ in range(PLACEMENT_TRIES):
        top = int(rng.integers(0, size - height + 1))
        left = int(rng.integers(0, size - width + 1))
        box = (top, left, top + height, left + width)
        if not any(boxes_overlap(box, other) for other in taken):
            return box
    return None


class DigitStream:
    """Digits of a pool in seeded shuffled order, reshuffled each time the pool is used up."""

    def __init__(self, pool: np.ndarray, rng: np.random.Generator):
        self.pool, self.rng, self.order, self.position = pool, rng, np.empty(0, np.int64), 0

    def take(self, count: int) -> list[int]:
        picked = []
        for _ in range(count):
            if self.position == len(self.order):
                self.order, self.position = self.rng.permutation(self.pool), 0
            picked.append(int(self.order[self.position]))
            self.position += 1
        return picked


def compose_canvas(digits: np.ndarray, labels: np.ndarray, boxes: np.ndarray, chosen: list[int], size: int,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, int]:
    """One (size, size) image and mask from the chosen digits; returns image, mask and digits placed."""
    image = np.zeros((size, size), np.uint8)
    mask = np.zeros((size, size), np.uint8)
    taken: list[tuple[int, int, int, int]] = []
    for index in chosen:
        top, left, bottom, right = boxes[index]
        crop = digits[index, top:bottom, left:right]
        spot = find_free_spot(rng, bottom - top, right - left, size, taken)
        if spot is None:
            continue
        taken.append(spot)
        window = (slice(spot[0], spot[2]), slice(spot[1], spot[3]))
        image[window] = crop
        mask[window] = np.where(crop >= STROKE_THRESHOLD, labels[index] + 1, 0)
    return image, mask, len(taken)


def compose_canvases(digits: np.ndarray, labels: np.ndarray, pool: np.ndarray, count: int, size: int,
                     max_digits: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`count` canvases from the digits in `pool`.

    Returns images (N, 1, S, S) uint8, masks (N, S, S) uint8 and the number of digits placed on each canvas.
    """
    boxes = ink_boxes(digits)
    stream = DigitStream(np.asarray(pool), rng)
    images = np.zeros((count, 1, size, size), np.uint8)
    masks = np.zeros((count, size, size), np.uint8)
    placed = np.zeros(count, np.int64)
    for i in range(count):
        chosen = stream.take(int(rng.integers(1, max_digits + 1)))
        images[i, 0], masks[i], placed[i] = compose_canvas(digits, labels, boxes, chosen, size, rng)
    return images, masks, placed


def canvas_count(pool_size: int, canvases_per_digit: float) -> int:
    """round(canvases_per_digit * pool size), at least one."""
    return max(1, round(canvases_per_digit * pool_size))
