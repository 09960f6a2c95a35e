"""What evaluate shows of a text model: the n-gram bag's most weighted n-grams per class, drawn as bar charts;
segmentation symmetries recorded in meta.json; the batch-size error names the largest value that works."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from trainlab.core.config import Params, TextParams
from trainlab.core.errors import DataError
from trainlab.data.thin_structures import write_paired_folders
from trainlab.jobs import pictures
from trainlab.jobs.prepare import prepare_segmentation, segmentation_symmetries
from trainlab.models.ngram_bag import log_count_ratios
from trainlab.tasks.text import CODE, top_ngrams

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "good", "bad", "movie", "not"]


META = {"num_classes": 2, "vocab_size": len(VOCAB), "max_length": 8, "pad_id": 0}


def trained_bag(arch, data_dir):
    """An n-gram bag fitted on 'good movie' and 'not bad' (class 1), 'bad movie' and 'not good' (class 0): the
    single words occur in both classes, so only the bigrams decide."""
    from trainlab.data.tokenizer import Tokenizer

    torch.manual_seed(0)
    g, b, m, n = 3, 4, 5, 6
    x = torch.tensor([[2, g, m], [2, n, b], [2, b, m], [2, n, g]])
    y = torch.tensor([1, 1, 0, 0])
    Tokenizer(VOCAB, max_length=8).save(data_dir / "tokenizer.json")
    # built as training builds it: the bags' statistics from this training split and its tokenizer
    # one head (a fixed weight decay), which top_ngrams reads
    model = CODE.build_trainable(TextParams(arch=arch, d_model=8, buckets=256, weight_decay=0.0), META,
                                 {"tokens": x, "labels": y}, data_dir).model
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    for _ in range(100):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model, x


@pytest.mark.parametrize("arch", ["ngram_bag", "nb_bag", "tfidf_bag"])
def test_top_ngrams_name_words_and_bigrams_that_decide_each_class(arch, tmp_path):
    model, x = trained_bag(arch, tmp_path)
    tops = top_ngrams(model, x, VOCAB, class_count=2, top=3)
    assert len(tops) == 2 and all(len(t) == 3 for t in tops)
    negative, positive = [[name for name, _ in t] for t in tops]
    assert {"not bad", "good movie"} <= set(positive)
    assert {"not good", "bad movie"} <= set(negative)
    assert all(s1 >= s2 for t in tops for (_, s1), (_, s2) in zip(t, t[1:]))  # largest first


def test_nb_bag_statistics_come_from_the_training_split_given_to_build_trainable():
    train = {"tokens": torch.tensor([[2, 3, 5], [2, 4, 5], [2, 3, 3]]), "labels": torch.tensor([1, 0, 1])}
    cfg = TextParams(arch="nb_bag", buckets=16)
    model = CODE.build_trainable(cfg, META, train).model
    expected = log_count_ratios(model.ids(train["tokens"]), train["labels"], len(VOCAB) + 16, 2, pad_id=0)
    assert torch.equal(model.ratios, expected)
    assert model.ratios[3, 1] > 0 > model.ratios[4, 1]  # 'good' only in class 1, 'bad' only in class 0
    # built without data (profiling, rebuilding a saved model): an unweighted bag until weights are loaded
    assert torch.equal(CODE.build_trainable(cfg, META).model.ratios, torch.ones(len(VOCAB) + 16, 2))


def test_tfidf_bag_statistics_come_from_the_training_split_and_the_prepared_tokenizer(tmp_path):
    from trainlab.data.tokenizer import Tokenizer
    from trainlab.models.tfidf_bag import char_ngram_table

    train = {"tokens": torch.tensor([[2, 3, 5], [2, 4, 5], [2, 3, 3]]), "labels": torch.tensor([1, 0, 1])}
    cfg = TextParams(arch="tfidf_bag", buckets=16, char_buckets=32)
    with pytest.raises(ValueError, match="tokenizer.json"):  # no prepared folder given
        CODE.build_trainable(cfg, META, train)
    Tokenizer(VOCAB, max_length=8).save(tmp_path / "tokenizer.json")
    model = CODE.build_trainable(cfg, META, train, tmp_path).model
    assert torch.equal(model.char_table, char_ngram_table(VOCAB, len(VOCAB), 3, 5, 32, len(VOCAB) + 16, 0))
    n = 3  # 'movie' (id 5) is in two of the three texts, 'not' (id 6) in none
    assert model.idf[5].item() == pytest.approx(math.log((1 + n) / (1 + 2)) + 1)
    assert model.idf[6] == 0


def test_ngram_bars_draw_one_chart_per_class(tmp_path):
    fig = pictures.ngram_bars(["neg", "pos"], [[("bad", 1.5), ("not good", 1.0)], [("good", 2.0)]])
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == ["class neg", "class pos"]
    pictures.save_figure(fig, tmp_path / "n.png")
    assert (tmp_path / "n.png").read_bytes()[:4] == b"\x89PNG"
    empty = pictures.ngram_bars(["a"], [[]], empty="The Transformer has no n-gram weights.")
    assert "no n-gram weights" in empty.axes[0].texts[0].get_text()


def test_symmetries_land_in_meta_and_embedded_canvases_refuse_them(tmp_path):
    root = write_paired_folders(tmp_path / "raw", count=10, size=32, seed=0)
    params = Params.model_validate({"data": {"segmentation": {"source": "paired_folders", "root": str(root),
                                                              "num_classes": 2, "symmetries": "dihedral"}}})
    prepare_segmentation(params, tmp_path / "prepared", log=lambda line: None)
    meta = json.loads((tmp_path / "prepared" / "meta.json").read_text())
    assert meta["symmetries"] == "dihedral" and meta["class_names"] == ["cell", "boundary"]
    assert segmentation_symmetries(Params()) == "none"
    with pytest.raises(DataError, match="data.segmentation.symmetries"):
        segmentation_symmetries(Params.model_validate({"data": {"segmentation": {"symmetries": "flips"}}}))


# text.weight_decay auto: one head per candidate, chosen on the validation split ---------------------------------------

def test_candidate_metrics_measure_every_head_and_choose_the_lowest_loss():
    from sklearn.metrics import f1_score

    from trainlab.tasks.text import CandidateMetrics

    labels = torch.arange(40) % 4
    predicted = torch.where(torch.arange(40) < 5, (labels + 1) % 4, labels)  # 35 of 40 right
    logits = torch.zeros(40, 3, 4)
    logits[:, 0] = 0.1 * F.one_hot(labels, 4)  # head 0: every text right, but barely (loss 1.31)
    logits[:, 1] = 2.0 * F.one_hot(predicted, 4)  # heads 1 and 2 predict alike, 2 with a larger margin: the
    logits[:, 2] = 3.0 * F.one_hot(predicted, 4)  # same accuracy at a lower loss (mean 0.51 against 0.59)
    metrics = CandidateMetrics(4, (1e-5, 1e-4, 1e-3))
    for part in (slice(0, 25), slice(25, 40)):  # two batches add up
        metrics.update(logits[part], labels[part])
    out = {k: float(v) for k, v in metrics.compute().items()}
    for k, decay in enumerate((1e-5, 1e-4, 1e-3)):
        predicted = logits[:, k].argmax(1)
        assert out[f"accuracy_wd_{decay:g}"] == pytest.approx((predicted == labels).double().mean().item())
        assert out[f"loss_wd_{decay:g}"] == pytest.approx(F.cross_entropy(logits[:, k], labels).item(), rel=1e-5)
    assert out["accuracy_wd_1e-05"] == 1 > out["accuracy_wd_0.0001"] == out["accuracy_wd_0.001"] == 35 / 40
    assert out["loss_wd_0.001"] < out["loss_wd_0.0001"] < out["loss_wd_1e-05"]
    assert out["weight_decay"] == pytest.approx(1e-3) and out["accuracy"] == out["accuracy_wd_0.001"]
    assert out["macro_f1"] == pytest.approx(f1_score(labels, logits[:, 2].argmax(1), average="macro"))


def test_candidate_loss_reports_the_heads_mean_and_trains_each_head_on_its_own_loss_and_decay():
    from trainlab.models.tfidf_bag import TfidfBag

    bag = TfidfBag(len(VOCAB), 2, 8, buckets=16, char_buckets=16, weight_decays=(1e-3, 1e-1))
    torch.nn.init.normal_(bag.weight)
    task = CODE.make_trainable(bag, META)
    x, y = torch.tensor([[2, 3, 5], [2, 4, 5]]), torch.tensor([1, 0])
    logits = bag(x)
    per_head = [F.cross_entropy(logits[:, k], y) for k in range(2)]
    expected = torch.autograd.grad(sum(per_head), bag.weight, retain_graph=True)[0]
    loss = task.loss_fn(logits, y)
    assert loss.item() == pytest.approx((sum(per_head) / 2).item())
    loss.backward()
    expected += bag.weight.detach() * torch.tensor([1e-3, 1e-3, 1e-1, 1e-1])
    torch.testing.assert_close(bag.weight.grad, expected)
    with torch.no_grad():  # validation: the mean, no penalty
        assert task.loss_fn(bag(x), y).item() == pytest.approx(loss.item())


def test_choose_model_keeps_the_validation_choice_as_a_plain_text_model():
    from trainlab.engine.loop import FitResult
    from trainlab.models.tfidf_bag import TfidfBag

    bag = TfidfBag(len(VOCAB), 2, 8, buckets=16, char_buckets=16, weight_decays=(1e-5, 1e-4, 1e-3))
    torch.nn.init.normal_(bag.weight)
    bag.config = {"task": "text", "arch": "tfidf_bag"}
    task = CODE.make_trainable(bag, META)
    row = {"val_accuracy": 0.75, "val_weight_decay": 9.9999997e-5,  # float32, as the history holds it
           **{f"val_accuracy_wd_{d:g}": a for d, a in ((1e-5, 0.7), (1e-4, 0.75), (1e-3, 0.6))},
           **{f"val_loss_wd_{d:g}": v for d, v in ((1e-5, 0.5), (1e-4, 0.55), (1e-3, 0.8))}}
    result = FitResult(model=bag, history=[row], params_total=bag.weight.numel() + bag.bias.numel())
    plain, chosen = CODE.choose_model(task, result)
    assert chosen == {"weight_decay": 1e-4, "candidates": {
        "1e-05": {"val_accuracy": 0.7, "val_loss": 0.5}, "0.0001": {"val_accuracy": 0.75, "val_loss": 0.55},
        "0.001": {"val_accuracy": 0.6, "val_loss": 0.8}}}
    assert result.model.weight_decays == () and result.params_total == (len(VOCAB) + 16 + 16) * 2 + 2
    assert torch.equal(result.model.weight[1:], bag.weight[2:, 2:4])  # row 0 of the candidates: [PAD]'s nothing
    assert result.model.weight[0].abs().sum() == 0 and result.model.config == bag.config
    assert type(plain).__name__ == "Trainable" and plain.model is result.model
    assert plain.predict(result.model(torch.tensor([[2, 3]]))).shape == (1,)
    # a model without candidates is kept as it is
    one = TfidfBag(len(VOCAB), 2, 8, buckets=16, char_buckets=16)
    same = FitResult(model=one, history=[{"val_accuracy": 0.5}])
    kept = CODE.make_trainable(one, META)
    assert CODE.choose_model(kept, same) == (kept, {}) and same.model is one


def test_the_text_training_reads_its_baseline_without_loading_scikit_learn(tmp_path):
    """Only the text_baseline stage fits the baseline; the training reads its JSON (sklearn is 1.5 s of start-up)."""
    import subprocess
    import sys

    (tmp_path / "baseline.json").write_text(json.dumps({"accuracy": 0.75, "macro_f1": 0.7}))
    code = ("import sys; from pathlib import Path; from trainlab.tasks.text import text_baseline; "
            f"r = text_baseline(Path({str(tmp_path / 'baseline.json')!r})); "
            "print(r['accuracy'], 'sklearn' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["0.75", "False"]
