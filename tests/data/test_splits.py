"""Stratified splits: exact per-class sizes, disjoint and complete, deterministic from the seed."""

import numpy as np
import pytest

from trainlab.core.errors import DataError
from trainlab.data.splits import require_every_class, train_val_test_split

LABELS = np.repeat(np.arange(4), 50)


def test_each_class_is_split_by_the_fractions():
    parts = train_val_test_split(LABELS, 0.1, 0.2, seed=3, key="k")
    for split, per_class in (("train", 35), ("val", 5), ("test", 10)):
        assert np.bincount(LABELS[parts[split]]).tolist() == [per_class] * 4


def test_splits_are_disjoint_and_cover_everything():
    parts = train_val_test_split(LABELS, 0.1, 0.2, seed=3, key="k")
    joined = np.concatenate(list(parts.values()))
    assert sorted(joined.tolist()) == list(range(len(LABELS)))


def test_same_seed_same_split_other_seed_other_split():
    a = train_val_test_split(LABELS, 0.1, 0.2, seed=3, key="k")
    b = train_val_test_split(LABELS, 0.1, 0.2, seed=3, key="k")
    c = train_val_test_split(LABELS, 0.1, 0.2, seed=4, key="k")
    assert all(np.array_equal(a[s], b[s]) for s in a)
    assert not np.array_equal(a["test"], c["test"])


def test_splits_are_not_ordered_by_class():
    parts = train_val_test_split(LABELS, 0.1, 0.2, seed=3, key="k")
    assert not np.all(np.diff(LABELS[parts["train"]]) >= 0)


def test_a_class_too_small_for_three_splits_is_named():
    labels = np.array([0] * 10 + [1] * 2)
    with pytest.raises(DataError, match=r"where: class 'rare' has only 2 sample"):
        train_val_test_split(labels, 0.1, 0.2, seed=0, key="k", class_names=["common", "rare"], what="where")


def test_a_class_with_no_samples_is_named():
    with pytest.raises(DataError, match=r"'b' have no samples"):
        require_every_class(np.array([0, 0, 2]), ["a", "b", "c"], "somewhere")
