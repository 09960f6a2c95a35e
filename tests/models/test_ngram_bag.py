"""Tests for the n-gram bag text model: hashed n-gram ids, padding left out, scores per n-gram, config round trip."""

from __future__ import annotations

import json

import torch

from trainlab.core.config import TextParams
from trainlab.models.text import build_text_model
from trainlab.tasks import build_from_config
from trainlab.models.ngram_bag import NgramBag, ngram_ids

PAD, CLS, VOCAB, MAX_LEN = 0, 2, 50, 16


def bag_params(**overrides):
    return TextParams(**{"arch": "ngram_bag", "d_model": 8, "ngrams": 2, "buckets": 64, **overrides})


def tokens():
    t = torch.tensor([[CLS, 5, 6, 7, PAD, PAD], [CLS, 7, 6, 5, 9, PAD]])
    return t


def test_ngram_ids_append_hashed_bigrams_and_pad_those_reaching_padding():
    ids = ngram_ids(tokens(), VOCAB, ngrams=2, buckets=64, pad_id=PAD)
    assert ids.shape == (2, 6 + 5)
    assert torch.equal(ids[:, :6], tokens())
    bigrams = ids[:, 6:]
    assert (bigrams[0, :3] >= VOCAB).all() and (bigrams[0, 3:] == PAD).all()  # (7, PAD) and later are padding
    assert (bigrams[1, :4] >= VOCAB).all() and (bigrams[1, 4:] == PAD).all()
    assert (bigrams < VOCAB + 64).all()
    # order matters: (5, 6) and (6, 5) are different bigrams (with these buckets they land apart)
    assert bigrams[0, 1] != bigrams[1, 2]
    # the same bigram gets the same id wherever it occurs
    again = ngram_ids(torch.tensor([[CLS, 9, 5, 6]]), VOCAB, 2, 64, PAD)
    assert again[0, 4 + 2] == bigrams[0, 1]


def test_trigrams_add_their_own_ids():
    ids = ngram_ids(tokens(), VOCAB, ngrams=3, buckets=64, pad_id=PAD)
    assert ids.shape == (2, 6 + 5 + 4)
    assert (ids[0, 11:13] >= VOCAB).all() and (ids[0, 13:] == PAD).all()


def test_logits_shape_and_padding_is_left_out():
    model = build_text_model(bag_params(), VOCAB, num_classes=3, max_length=MAX_LEN).eval()  # no dropout
    assert isinstance(model, NgramBag) and model.config["arch"] == "ngram_bag"
    torch.nn.init.normal_(model.head.weight)  # the fastText init starts the head at zero
    t = tokens()
    longer = torch.cat([t, torch.full((2, 5), PAD)], 1)
    with torch.no_grad():
        out = model(t)
        assert out.shape == (2, 3)
        torch.testing.assert_close(model(longer), out)
        assert not torch.allclose(out[0], out[1])


def test_ngram_scores_add_up_to_the_logits():
    model = build_text_model(bag_params(), VOCAB, 3, MAX_LEN).eval()
    torch.nn.init.normal_(model.head.weight)
    t = tokens()[:1]
    ids = model.ids(t)[0]
    real = ids[ids != PAD]
    expected = model.ngram_scores(real).mean(0) + model.head.bias
    torch.testing.assert_close(model(t)[0], expected, rtol=1e-5, atol=1e-6)


def test_trains_to_separate_classes_by_word_order():
    """Same words, different order: only the bigrams tell the classes apart."""
    torch.manual_seed(0)
    a = torch.tensor([[CLS, 5, 6, 7]] * 8)
    b = torch.tensor([[CLS, 7, 6, 5]] * 8)
    x, y = torch.cat([a, b]), torch.tensor([0] * 8 + [1] * 8)
    for ngrams, should_learn in ((1, False), (2, True)):
        model = build_text_model(bag_params(ngrams=ngrams), VOCAB, 2, MAX_LEN)
        opt = torch.optim.Adam(model.parameters(), lr=0.1)
        for _ in range(50):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        accuracy = (model(x).argmax(1) == y).float().mean().item()
        assert (accuracy == 1.0) == should_learn


def test_config_round_trip_rebuilds_the_same_architecture(tmp_path):
    model = build_text_model(bag_params(ngrams=3, buckets=32), VOCAB, 4, MAX_LEN)
    (tmp_path / "config.json").write_text(json.dumps(model.config))
    again = build_from_config("text", json.loads((tmp_path / "config.json").read_text()))
    assert isinstance(again, NgramBag) and again.config == model.config
    again.load_state_dict(model.state_dict())


def test_transformer_config_still_round_trips():
    model = build_text_model(TextParams(d_model=16, n_heads=2, n_layers=1, dim_feedforward=32,
                                        embedding_dropout=0.2), VOCAB, 4, MAX_LEN)
    again = build_from_config("text", json.loads(json.dumps(model.config)))
    assert again.config == model.config and again.embedding_dropout == 0.2


def test_embedding_dropout_drops_whole_words_in_training_only():
    model = build_text_model(TextParams(d_model=16, n_heads=2, n_layers=1, dim_feedforward=32, dropout=0.0,
                                        embedding_dropout=0.5), VOCAB, 4, MAX_LEN)
    t = tokens()
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(t), model(t))
        model.train()
        torch.manual_seed(0)
        first = model(t)
        torch.manual_seed(1)
        assert not torch.allclose(first, model(t))
