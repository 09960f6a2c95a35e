"""Tests for the TF-IDF bag text model: character n-grams as scikit-learn's char_wb, idf as scikit-learn's, logits
as the documented TF-IDF formula, padding left out, dropout in training only, saved statistics, learning."""

from __future__ import annotations

import math
import zlib
from collections import Counter

import pytest
import torch
from sklearn.feature_extraction.text import TfidfTransformer, TfidfVectorizer

from trainlab.core.config import TextParams
from trainlab.models.text import build_text_model
from trainlab.models.tfidf_bag import CHAR_SLOTS, TfidfBag, char_ngram_table, char_ngrams
from tests.models.test_ngram_bag import assert_random_only_in_training

PAD, CLS = 0, 2
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "good", "bad", "movie", "not", "goodness", "a"]
MAX_LEN = 8


def bag_params(**overrides):
    return TextParams(**{"arch": "tfidf_bag", "ngrams": 2, "buckets": 64, "char_buckets": 128, **overrides})


def fitted(tokens, **overrides) -> TfidfBag:
    model = build_text_model(bag_params(**overrides), len(VOCAB), 3, MAX_LEN)
    model.fit_vocabulary(VOCAB)
    model.fit_idf(tokens)
    return model


def texts():
    g, b, m, n, gs, a = 3, 4, 5, 6, 7, 8
    return torch.tensor([[CLS, g, m, PAD, PAD], [CLS, n, b, m, PAD], [CLS, gs, a, g, g], [CLS, 1, b, PAD, PAD]])


def test_char_ngrams_are_scikit_learns_char_wb_ngrams_of_a_word():
    analyzer = TfidfVectorizer(analyzer="char_wb", ngram_range=(3, 5)).build_analyzer()
    for word in ("good", "a", "goodness", "don't"):
        assert Counter(char_ngrams(word, 3, 5)) == Counter(analyzer(word))


def test_char_table_hashes_each_words_ngrams_stably_and_leaves_special_tokens_empty():
    table = char_ngram_table(VOCAB, rows=len(VOCAB) + 2, low=3, high=5, buckets=128, offset=100, pad_id=PAD)
    assert table.shape == (len(VOCAB) + 2, CHAR_SLOTS)
    assert (table[:3] == PAD).all() and (table[len(VOCAB):] == PAD).all()  # specials and hashed OOV ids: none
    grams = char_ngrams("good", 3, 5)
    assert table[3, :len(grams)].tolist() == [100 + zlib.crc32(g.encode()) % 128 for g in grams]
    assert (table[3, len(grams):] == PAD).all()
    # "good" and "goodness" share " go", " goo", " good", "goo", "ood": the same ids
    assert {100 + zlib.crc32(g.encode()) % 128 for g in (" go", "goo", "ood")} <= set(table[7].tolist())


def test_idf_is_scikit_learns_smooth_idf_of_the_training_texts_and_zero_for_unseen_features():
    x = texts()
    model = fitted(x)
    ids = torch.cat([model.word_ids(x), model.char_ids(x)], 1)
    counts = torch.zeros(len(x), model.idf.numel())
    for row, row_ids in enumerate(ids):
        for f in row_ids.tolist():
            if f != PAD:
                counts[row, f] += 1
    seen = counts.sum(0) > 0
    expected = TfidfTransformer(smooth_idf=True).fit(counts[:, seen].numpy()).idf_
    torch.testing.assert_close(model.idf[seen], torch.tensor(expected, dtype=torch.float32))
    assert (model.idf[~seen] == 0).all() and model.idf[PAD] == 0


def test_logits_are_the_linear_layer_over_two_l2_normalised_tfidf_vectors_and_padding_is_left_out():
    x = texts()
    model = fitted(x).eval()
    torch.nn.init.normal_(model.weight)
    torch.nn.init.normal_(model.bias)
    with torch.no_grad():
        out = model(x)
        longer = torch.cat([x, torch.full((len(x), 3), PAD)], 1)
        torch.testing.assert_close(model(longer), out)
        for row in range(len(x)):
            expected = model.bias.clone()
            for ids in (model.word_ids(x[row:row + 1])[0], model.char_ids(x[row:row + 1])[0]):
                real = [f for f in ids.tolist() if f != PAD]
                norm = math.sqrt(sum(float(model.idf[f]) ** 2 for f in real))  # occurrences as distinct features
                for f in real:
                    expected += float(model.idf[f]) / norm * model.weight[f]
            torch.testing.assert_close(out[row], expected, rtol=1e-5, atol=1e-5)


def test_without_char_ngrams_only_words_and_word_ngrams_count():
    x = texts()
    model = fitted(x, char_ngrams=None)
    assert model.char_ids(x).shape == (len(x), 0) and model.idf.numel() == len(VOCAB) + 64
    assert model(x).shape == (len(x), 3)


def test_dropout_drops_features_in_training_only():
    model = fitted(texts(), dropout=0.5)
    torch.nn.init.normal_(model.weight)
    assert_random_only_in_training(model, texts())


def test_statistics_travel_with_the_weights_and_rebuild_identical_logits(tmp_path):
    """Saved like a training stage saves (safetensors + config.json), loaded like evaluate loads: same logits."""
    from trainlab.jobs.train import save_model
    from trainlab.tasks.saved import load_saved_model

    model = fitted(texts(), char_ngrams=(2, 4))
    torch.nn.init.normal_(model.weight)
    save_model(model, tmp_path / "model")
    again = load_saved_model(tmp_path / "model", "text").model
    assert isinstance(again, TfidfBag) and again.config == model.config and again.char_ngrams == (2, 4)
    assert torch.equal(again.idf, model.idf) and torch.equal(again.char_table, model.char_table)
    with torch.no_grad():
        assert torch.equal(again(texts()), model.eval()(texts()))


def test_char_ngrams_carry_what_a_word_shares_with_a_word_seen_in_training():
    """Trained on 'good' (class 1) and 'bad' (class 0) only, the bag puts 'goodness', never seen in training, in
    class 1 through the character n-grams it shares with 'good'; without them it cannot tell."""
    g, b, gs = 3, 4, 7
    x = torch.tensor([[CLS, g]] * 4 + [[CLS, b]] * 4)
    y = torch.tensor([1] * 4 + [0] * 4)
    unseen = torch.tensor([[CLS, gs]])
    for chars, should_know in (((3, 5), True), (None, False)):
        torch.manual_seed(0)
        model = fitted(x, char_ngrams=chars)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        for _ in range(50):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x)[:, :2], y).backward()
            opt.step()
        with torch.no_grad():
            margin = (model(unseen)[0, 1] - model(unseen)[0, 0]).item()
        assert (margin > 0.5) == should_know, margin


def test_char_ngram_range_is_checked():
    with pytest.raises(ValueError, match="low <= high"):
        TextParams(char_ngrams=(5, 3))
