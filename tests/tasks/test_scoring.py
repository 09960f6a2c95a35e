"""trainlab.tasks.scoring and the tasks' evaluation helpers: metric values on known predictions, TTA, chunking, feature
layers, summaries."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainlab.core.config import ClassifierParams
from trainlab.core.flatten import numbers
from trainlab.engine import metrics as engine_metrics
from trainlab.engine.metrics import update_in_chunks
from trainlab.models.classifier import build_classifier
from trainlab.tasks import get
from trainlab.tasks.classifier import feature_layers, feature_maps
from trainlab.tasks.metrics import METRICS, class_metric_keys, classification_metrics, segmentation_metrics
from trainlab.tasks.scoring import SHIFTS, confusion_rows, predict_logits, summarize


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run faster on one thread, and 2 threads on a busy 2-core machine can be 100x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_classification_metrics_on_known_predictions():
    target = torch.tensor([0, 0, 1, 1, 2, 2])
    preds = torch.tensor([0, 1, 1, 1, 2, 0])
    metrics = classification_metrics(3)
    update_in_chunks(metrics, preds, target, 3)
    out = metrics.compute()
    assert float(out["accuracy"]) == pytest.approx(4 / 6)
    assert out["confusion"].tolist() == [[1, 1, 0], [0, 2, 0], [1, 0, 1]]
    assert int(out["confusion"].sum()) == len(target)
    assert out["precision"].tolist() == pytest.approx([1 / 2, 2 / 3, 1.0])
    assert out["recall"].tolist() == pytest.approx([1 / 2, 1.0, 1 / 2])
    f1 = [2 * p * r / (p + r) for p, r in zip(out["precision"].tolist(), out["recall"].tolist())]
    assert float(out["macro_f1"]) == pytest.approx(sum(f1) / 3)


def test_segmentation_metrics_perfect_and_known():
    masks = torch.randint(0, 4, (2, 8, 8), generator=torch.Generator().manual_seed(0))
    perfect = segmentation_metrics(4)
    update_in_chunks(perfect, masks, masks, 4)
    out = perfect.compute()
    assert float(out["mean_iou"]) == float(out["mean_dice"]) == float(out["pixel_accuracy"]) == 1.0

    target = torch.tensor([[0, 0, 1, 1]])
    preds = torch.tensor([[0, 1, 1, 1]])
    metrics = segmentation_metrics(2)
    update_in_chunks(metrics, preds, target, 2)
    out = metrics.compute()
    assert out["iou"].tolist() == pytest.approx([1 / 2, 2 / 3])
    assert out["dice"].tolist() == pytest.approx([2 / 3, 4 / 5])
    assert float(out["mean_iou"]) == pytest.approx((1 / 2 + 2 / 3) / 2)
    assert float(out["pixel_accuracy"]) == pytest.approx(3 / 4)


def test_chunked_updates_give_the_same_numbers(monkeypatch):
    gen = torch.Generator().manual_seed(1)
    target, preds = torch.randint(0, 5, (3, 16, 16), generator=gen), torch.randint(0, 5, (3, 16, 16), generator=gen)
    whole = segmentation_metrics(5)
    update_in_chunks(whole, preds, target, 5)
    monkeypatch.setattr(engine_metrics, "CHUNK_ELEMENTS", 25 * 7)  # chunks of 7 pixels
    chunked = segmentation_metrics(5)
    update_in_chunks(chunked, preds, target, 5)
    a, b = whole.compute(), chunked.compute()
    assert all(torch.equal(a[k], b[k]) for k in a)


class Pointwise(nn.Module):
    """A 1x1 conv: flip-equivariant, so un-flipped TTA logits equal the plain ones."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 1)

    def forward(self, x):
        return self.conv(x)


class LeftHeavy(nn.Module):
    """Logits that depend on the column: flipping changes them."""

    def forward(self, x):
        ramp = torch.linspace(0, 1, x.shape[-1])
        return torch.cat([x * ramp, x * (1 - ramp)], dim=1)


def test_flip_tta_unflips_dense_logits():
    x = torch.rand(2, 1, 6, 6, generator=torch.Generator().manual_seed(0))
    model = Pointwise()
    assert torch.allclose(predict_logits(model, x, tta="flip", dense=True), predict_logits(model, x), atol=1e-6)
    left = LeftHeavy()
    expected = (left(x) + left(x.flip(-1)).flip(-1)) / 2
    assert torch.allclose(predict_logits(left, x, tta="flip", dense=True), expected)
    assert not torch.allclose(predict_logits(left, x, tta="flip", dense=True), left(x))


def test_flip_tta_averages_image_logits():
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 4))
    x = torch.rand(3, 1, 3, 4, generator=torch.Generator().manual_seed(2))
    expected = (model(x) + model(x.flip(-1))) / 2
    assert torch.allclose(predict_logits(model, x, tta="flip"), expected)


def test_shift_tta_moves_dense_logits_back_and_averages_image_logits():
    x = torch.rand(2, 1, 6, 6, generator=torch.Generator().manual_seed(3))
    pointwise = Pointwise()  # shifting in and out again is the identity for a pixel-wise model
    assert torch.allclose(predict_logits(pointwise, x, tta="shift", dense=True), pointwise(x), atol=1e-6)
    left = LeftHeavy()
    expected = (left(x) + sum(torch.roll(left(torch.roll(x, s, (-2, -1))), (-s[0], -s[1]), (-2, -1))
                              for s in SHIFTS)) / 5
    assert torch.allclose(predict_logits(left, x, tta="shift", dense=True), expected, atol=1e-6)
    model = nn.Sequential(nn.Flatten(), nn.Linear(36, 4))
    expected = (model(x) + sum(model(torch.roll(x, s, (-2, -1))) for s in SHIFTS)) / 5
    assert torch.allclose(predict_logits(model, x, tta="shift"), expected, atol=1e-6)


def test_tta_mode_mirrors_only_where_the_data_allows():
    def tta_mode(meta, name):
        return get(name).load().tta(meta)

    assert tta_mode({"hflip": True}, "classifier") == "flip"
    assert tta_mode({"hflip": False}, "segmenter") == "shift"
    assert tta_mode({}, "classifier") == "shift"  # data prepared before the flag existed: no mirroring
    assert tta_mode({"hflip": True}, "text") == "none"


def test_feature_layers_pick_an_early_and_a_late_activation():
    model = build_classifier(ClassifierParams(width=4, stem_pool=1), 10, 1).eval()  # the blocks at 28x28
    x = torch.zeros(1, 1, 28, 28)
    layers = feature_layers(model, x)
    assert layers == ["blocks.0.relu", "blocks.2.relu_1"]
    maps = feature_maps(model, torch.zeros(2, 1, 28, 28, dtype=torch.uint8), torch.device("cpu"))
    assert {k: tuple(v.shape) for k, v in maps.items()} == {"blocks.0.relu": (2, 4, 28, 28),
                                                            "blocks.2.relu_1": (2, 4, 7, 7)}


def test_summaries_and_names():
    assert class_metric_keys(["background", "a.b", "a b", "", "a_b"], 5) == ["background", "a_b", "a_b_2", "3", "a_b_4"]
    metrics = classification_metrics(2)
    update_in_chunks(metrics, torch.tensor([0, 1, 1]), torch.tensor([0, 1, 0]), 2)
    summary = summarize(metrics.compute(), METRICS["classifier"], ["no", "yes"], 3)
    assert summary == {"accuracy": pytest.approx(2 / 3, abs=1e-6), "macro_f1": pytest.approx(2 / 3, abs=1e-6),
                       "precision": {"no": 1.0, "yes": 0.5}, "recall": {"no": 0.5, "yes": 1.0}, "test_samples": 3}
    assert numbers({"classifier": summary, "flag": True})["classifier.precision.yes"] == 0.5
    assert "flag" not in numbers({"flag": True})
    rows = confusion_rows(torch.tensor([0, 1]), torch.tensor([1, 1]), ["no", "yes"])
    assert rows == [{"actual": "no", "predicted": "yes"}, {"actual": "yes", "predicted": "yes"}]


def test_metrics_are_bitwise_repeatable():
    gen = torch.Generator().manual_seed(3)
    target, preds = torch.randint(0, 11, (4, 32, 32), generator=gen), torch.randint(0, 11, (4, 32, 32), generator=gen)
    results = []
    for _ in range(2):
        metrics = segmentation_metrics(11)
        update_in_chunks(metrics, preds, target, 11)
        results.append(metrics.compute())
    assert all(torch.equal(results[0][k], results[1][k]) for k in results[0])
