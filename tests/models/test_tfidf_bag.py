"""Tests for the TF-IDF bag text model: character n-grams as scikit-learn's char_wb, idf as scikit-learn's, logits
as the documented TF-IDF formula, padding left out, dropout in training only, saved statistics, learning."""

from __future__ import annotations

import math
import zlib
from collections import Counter

import pytest
import torch
from sklearn.feature_extraction.text import TfidfTransformer, TfidfVectorizer

from tests.models.test_ngram_bag import assert_random_only_in_training
from trainlab.core.config import TextParams
from trainlab.models.text import build_text_model
from trainlab.models.tfidf_bag import CHAR_SLOTS, TfidfBag, char_ngram_table, char_ngrams

PAD, CLS = 0, 2
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "good", "bad", "movie", "not", "goodness", "a"]
MAX_LEN = 8


def bag_params(**overrides):
    # one head (a fixed weight decay); the candidate heads of weight_decay auto are asked for by name below
    return TextParams(**{"arch": "tfidf_bag", "ngrams": 2, "buckets": 64, "char_buckets": 128, "weight_decay": 0.0,
                         **overrides})


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


# One head per candidate weight decay (text.weight_decay auto) ---------------------------------------------------------

DECAYS = (1e-4, 1e-2, 0.3)


def test_each_head_of_a_candidate_bag_is_the_one_head_bag_with_its_weights():
    x = texts()
    bag = fitted(x, weight_decay="auto")
    heads = len(bag.weight_decays)  # build_text_model's: trainlab.models.tfidf_bag.WEIGHT_DECAY_CANDIDATES
    assert heads > 1
    torch.nn.init.normal_(bag.weight)
    torch.nn.init.normal_(bag.bias)
    with torch.no_grad():
        logits = bag.eval()(x)
        assert logits.shape == (len(x), heads, 3)
        for k in range(heads):
            one = bag.select_head(k)
            assert isinstance(one, TfidfBag) and one.weight_decays == () and one.weight.shape == (bag.idf.numel(), 3)
            assert one.config == bag.config and torch.equal(one.idf, bag.idf)
            torch.testing.assert_close(one.eval()(x), logits[:, k], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="not one of the"):
        bag.select_head(heads)


def test_l2_penalty_is_zero_with_each_heads_decay_times_its_weight_as_gradient_scaled_like_the_loss():
    bag = TfidfBag(len(VOCAB), 2, MAX_LEN, buckets=8, char_buckets=8, weight_decays=DECAYS)
    torch.nn.init.normal_(bag.weight)
    penalty = bag.l2_penalty()
    assert penalty.item() == 0
    (3 * penalty).backward()
    expected = 3 * bag.weight.detach() * torch.tensor(DECAYS).repeat_interleave(2)
    torch.testing.assert_close(bag.weight.grad, expected)
    assert bag.bias.grad is None  # biases are not decayed
    assert TfidfBag(len(VOCAB), 2, MAX_LEN).l2_penalty().item() == 0
    one = TfidfBag(len(VOCAB), 2, MAX_LEN, buckets=8, char_buckets=8, weight_decays=(1e-3,))  # a single candidate
    assert one(texts()).shape == (len(texts()), 1, 2)
    with pytest.raises(ValueError, match="finite and >= 0"):
        TfidfBag(len(VOCAB), 2, MAX_LEN, weight_decays=(1e-3, -1.0))


def test_heads_train_as_one_head_bags_each_with_sgds_weight_decay():
    """Twelve engine steps of SGD (Nesterov momentum, cosine LR, no clipping): head k of the candidate bag ends
    where a one-head bag trained alone with weight_decay DECAYS[k] ends (the text task's loss, the engine's step),
    and the same training again ends bitwise where the first did."""
    from trainlab.core.config import BaseParams
    from trainlab.core.runtime import resolve_runtime
    from trainlab.engine.step import TrainStep
    from trainlab.tasks.text import text_trainable

    runtime = resolve_runtime(BaseParams(device="cpu", precision="fp32"))
    x = texts().repeat(4, 1)
    y = torch.tensor([0, 1, 2, 1] * 4)

    def trained(decays, weight_decay):
        cfg = TextParams(arch="tfidf_bag", optimizer="sgd", lr=2.0, weight_decay=weight_decay, grad_clip=None,
                         epochs=1, warmup_epochs=0)
        torch.manual_seed(0)
        model = TfidfBag(len(VOCAB), 3, MAX_LEN, buckets=64, char_buckets=128, weight_decays=decays)
        model.fit_vocabulary(VOCAB)
        model.fit_idf(x)
        step = TrainStep(text_trainable(model, 3), model, cfg, runtime, total_updates=12)
        for i in range(12):
            step({"tokens": x[i % 4::4], "labels": y[i % 4::4]})
        return model

    together = trained(DECAYS, "auto")
    for k, decay in enumerate(DECAYS):
        alone = trained((), decay)
        chosen = together.select_head(k)
        torch.testing.assert_close(chosen.weight, alone.weight, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(chosen.bias, alone.bias, rtol=1e-4, atol=1e-6)
    assert not torch.allclose(together.select_head(0).weight, together.select_head(2).weight, atol=1e-3)
    assert torch.equal(trained(DECAYS, "auto").weight, together.weight)  # seeded: bitwise the same again


def test_a_chosen_head_saves_and_loads_as_a_plain_tfidf_bag(tmp_path):
    from trainlab.jobs.train import save_model
    from trainlab.tasks.saved import load_saved_model

    bag = fitted(texts(), weight_decay="auto")
    torch.nn.init.normal_(bag.weight)
    chosen = bag.select_head(2)
    save_model(chosen, tmp_path / "model")
    again = load_saved_model(tmp_path / "model", "text").model
    assert again.weight_decays == () and again.config == chosen.config
    with torch.no_grad():
        assert torch.equal(again(texts()), chosen.eval()(texts()))


def test_the_candidates_cpu_gather_and_the_graph_safe_gather_agree_in_value_and_gradient():
    """On the CPU the heads' rows are summed by embedding_bag over the slots that hold a feature (and the gradient
    is one index_add); elsewhere (its CUDA backward syncs with the host) by
    index_select, as a one-head bag's: the same logits and weight gradients."""
    x = texts()
    bag = fitted(x, weight_decay="auto")
    torch.nn.init.normal_(bag.weight)
    ids = bag.rows[torch.cat([bag.word_ids(x), bag.char_ids(x)], 1)]
    ids[1] = 0  # a text of padding only (the CPU path leaves padding out before embedding_bag): a row of zeros
    weights = torch.rand(ids.shape) * (ids > 0)
    results = []
    for fused in (True, False):
        bag.weight.grad = None
        out = bag.weighted_rows(ids, weights, bag=fused)
        out.square().sum().backward()
        results.append((out.detach(), bag.weight.grad.clone()))
    torch.testing.assert_close(results[0][0], results[1][0])
    torch.testing.assert_close(results[0][1], results[1][1])
    assert results[0][0][1].eq(0).all() and results[0][1].abs().sum() > 0


def test_gather_is_advanced_indexing():
    from trainlab.models.tfidf_bag import gather

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (4, 7), generator=generator)
    for table in (torch.rand(50, generator=generator), torch.randint(0, 9, (50, 3), generator=generator)):
        assert torch.equal(gather(table, ids), table[ids])
    strided = ids[:, ::2]  # not contiguous
    assert torch.equal(gather(table, strided), table[strided]) and gather(table, strided).shape == (4, 4, 3)
