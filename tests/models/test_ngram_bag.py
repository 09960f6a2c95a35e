"""Tests for the n-gram bag text models (fastText-style and NB-weighted): hashed n-gram ids, padding left out, scores
per n-gram, NB log-count ratios, config and weights round trip."""

from __future__ import annotations

import json

import torch

from trainlab.core.config import TextParams
from trainlab.models.ngram_bag import NBNgramBag, NgramBag, log_count_ratios, ngram_ids
from trainlab.models.text import build_text_model
from trainlab.tasks import build_from_config

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
    model = build_text_model(TextParams(arch="transformer", d_model=16, n_heads=2, n_layers=1, dim_feedforward=32,
                                        embedding_dropout=0.2), VOCAB, 4, MAX_LEN)
    again = build_from_config("text", json.loads(json.dumps(model.config)))
    assert again.config == model.config and again.embedding_dropout == 0.2


def assert_random_only_in_training(model, t):
    """The same output twice in eval mode; different outputs for different seeds in training mode."""
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(t), model(t))
        model.train()
        torch.manual_seed(0)
        first = model(t)
        torch.manual_seed(1)
        assert not torch.allclose(first, model(t))


def test_embedding_dropout_drops_whole_words_in_training_only():
    model = build_text_model(TextParams(arch="transformer", d_model=16, n_heads=2, n_layers=1, dim_feedforward=32,
                                        dropout=0.0, embedding_dropout=0.5), VOCAB, 4, MAX_LEN)
    assert_random_only_in_training(model, tokens())


# The NB-weighted bag (text.arch nb_bag) ---------------------------------------------------------------------------

def nb_params(**overrides):
    return TextParams(**{"arch": "nb_bag", "ngrams": 2, "buckets": 64, **overrides})


def test_log_count_ratios_count_each_feature_once_per_text_one_class_against_the_rest():
    ids = torch.tensor([[5, 5, 6, PAD], [6, 7, PAD, PAD], [7, 7, 7, 5]])
    labels = torch.tensor([0, 1, 1])
    r = log_count_ratios(ids, labels, num_features=8, num_classes=2, pad_id=PAD, alpha=1.0)
    assert r.shape == (8, 2)
    # texts holding each feature (binarised): class 0 has {5, 6}; class 1 has {6, 7} and {5, 7}
    counts = {0: torch.zeros(8), 1: torch.zeros(8)}
    for f in (5, 6):
        counts[0][f] += 1
    for f in (6, 7, 5, 7):
        counts[1][f] += 1
    for c, other in ((0, 1), (1, 0)):
        p, q = counts[c] + 1, counts[other] + 1
        expected = (p / p.sum()).log() - (q / q.sum()).log()
        expected[PAD] = 0
        torch.testing.assert_close(r[:, c], expected)
    assert r[7, 1] > 0 > r[7, 0]  # 7 occurs only in class 1


def test_nb_bag_logits_shape_padding_left_out_and_scores_add_up():
    model = build_text_model(nb_params(), VOCAB, num_classes=3, max_length=MAX_LEN)
    assert isinstance(model, NBNgramBag) and model.config["arch"] == "nb_bag"
    t = tokens()
    model.fit_ratios(t, torch.tensor([0, 2]))
    torch.nn.init.normal_(model.weight)  # learnt from zero: give it weights to look at
    model.eval()
    longer = torch.cat([t, torch.full((2, 5), PAD)], 1)
    with torch.no_grad():
        out = model(t)
        assert out.shape == (2, 3)
        torch.testing.assert_close(model(longer), out)
        ids = model.ids(t[:1])[0]
        real = ids[ids != PAD]
        torch.testing.assert_close(out[0], model.ngram_scores(real).mean(0) + model.bias, rtol=1e-5, atol=1e-6)


def test_nb_bag_dropout_drops_ngrams_in_training_only():
    model = build_text_model(nb_params(dropout=0.5), VOCAB, 2, MAX_LEN)
    torch.nn.init.normal_(model.weight)
    assert_random_only_in_training(model, tokens())


def test_nb_bag_ratios_travel_with_the_weights_and_rebuild_identical_logits(tmp_path):
    """Saved like a training stage saves (safetensors + config.json), loaded like evaluate loads: same logits."""
    from trainlab.jobs.train import save_model
    from trainlab.tasks.saved import load_saved_model

    model = build_text_model(nb_params(ngrams=3, buckets=32), VOCAB, 2, MAX_LEN)
    model.fit_ratios(tokens(), torch.tensor([0, 1]))
    torch.nn.init.normal_(model.weight)
    save_model(model, tmp_path / "model")
    again = load_saved_model(tmp_path / "model", "text").model
    assert isinstance(again, NBNgramBag) and again.config == model.config
    assert torch.equal(again.ratios, model.ratios) and not torch.equal(again.ratios, torch.ones_like(again.ratios))
    with torch.no_grad():
        assert torch.equal(again(tokens()), model.eval()(tokens()))


def test_nb_bag_same_seed_same_numbers():
    x = torch.randint(3, VOCAB, (32, 10))
    y = (x[:, 1] % 2).long()

    def train(seed):
        torch.manual_seed(seed)
        model = build_text_model(nb_params(dropout=0.3), VOCAB, 2, MAX_LEN)
        model.fit_ratios(x, y)
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)
        for _ in range(5):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        return model.weight.detach().clone()

    assert torch.equal(train(0), train(0))
    assert not torch.equal(train(0), train(1))  # the seed reaches the n-gram dropout
