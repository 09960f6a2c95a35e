"""Tests for trainlab.jobs.pictures: each figure draws from plain tensors and saves as a PNG, edge cases included."""

from __future__ import annotations

import torch
from matplotlib.figure import Figure

from trainlab.jobs import pictures

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def saved(fig: Figure, path) -> bytes:
    pictures.save_figure(fig, path)
    return path.read_bytes()


def test_misclassified_grid(tmp_path):
    images = torch.randint(0, 256, (10, 1, 28, 28), dtype=torch.uint8)
    fig = pictures.misclassified_grid(images, torch.arange(10), (torch.arange(10) + 1) % 10,
                                      [str(i) for i in range(10)], torch.arange(10), total_wrong=12, total=40)
    titled = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert len(titled) == 10 and titled[0] == "#0 true 0\npred 1"
    assert "10 shown, 12 wrong of 40" in fig.get_suptitle()
    assert saved(fig, tmp_path / "m.png")[:8] == PNG_MAGIC


def test_misclassified_grid_rgb_and_empty(tmp_path):
    rgb = torch.randint(0, 256, (2, 3, 8, 8), dtype=torch.uint8)
    fig = pictures.misclassified_grid(rgb, torch.tensor([0, 1]), torch.tensor([1, 0]), ["cat", "dog"])
    assert fig.axes[0].get_images()[0].get_array().shape == (8, 8, 3)
    empty = pictures.misclassified_grid(torch.zeros(0, 1, 8, 8, dtype=torch.uint8), torch.zeros(0), torch.zeros(0),
                                        ["a"], total=5)
    assert "No misclassified" in empty.axes[0].texts[0].get_text()
    assert saved(empty, tmp_path / "e.png")[:8] == PNG_MAGIC


def test_segmentation_overlays_fixed_colours_and_legend(tmp_path):
    names = ["background", *map(str, range(10))]
    masks = torch.randint(0, 11, (2, 16, 16))
    fig = pictures.segmentation_overlays(masks.unsqueeze(1).to(torch.uint8) * 20, masks, masks.flip(-1), names)
    assert len(fig.axes) == 6
    legend = fig.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == names
    cmap = pictures.class_colours(names)
    assert cmap(0) == pictures.BACKGROUND_COLOUR and len(set(cmap.colors)) == 11
    truth = fig.axes[1].get_images()[0]
    assert truth.get_clim() == (-0.5, 10.5)  # the same class always gets the same colour
    assert saved(fig, tmp_path / "s.png")[:8] == PNG_MAGIC


def test_attention_heatmaps_label_tokens(tmp_path):
    tokens = [["[CLS]", "good", "day"], ["[CLS]", "bad"]]
    attentions = [torch.softmax(torch.rand(3, 3), -1), torch.softmax(torch.rand(2, 2), -1)]
    fig = pictures.attention_heatmaps(tokens, attentions, ["true a, predicted a", "true b, predicted a"])
    heatmaps = [ax for ax in fig.axes if ax.get_images()]
    assert len(heatmaps) == 2
    assert [t.get_text() for t in heatmaps[0].get_xticklabels()] == tokens[0]
    assert heatmaps[1].get_title() == "true b, predicted a"
    assert saved(fig, tmp_path / "a.png")[:8] == PNG_MAGIC


def test_feature_map_grid(tmp_path):
    images = torch.randint(0, 256, (2, 1, 12, 12), dtype=torch.uint8)
    features = {"stem": torch.rand(2, 4, 12, 12), "late": torch.rand(2, 3, 3, 3)}
    fig = pictures.feature_map_grid(images, features)
    assert len(fig.axes) == 2 * (1 + 4 + 3)
    assert fig.axes[0].get_title() == "input" and fig.axes[5].get_title() == "late\nch 0"
    assert saved(fig, tmp_path / "f.png")[:8] == PNG_MAGIC


def test_display_text_drops_control_characters_and_escapes_dollars():
    assert pictures.display_text("don\x8d\x81t\ttoday\n") == "dont today "
    assert pictures.display_text("$5 or $x^$") == r"\$5 or \$x^\$"
    assert pictures.display_text("Õ¢ café") == "Õ¢ café"  # printable characters stay


def test_a_tweet_with_char_141_draws_with_no_warning(tmp_path):
    """The embedded tweets hold mis-decoded bytes such as \\x8d; drawn raw, matplotlib warns 'Glyph 141 missing'."""
    import warnings

    from trainlab.data.embedded import load_tweets

    texts, _ = load_tweets()
    tweet = next(t for t in texts if "\x8d" in t and "$" not in t)
    words = tweet.split()[:12]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        saved(pictures.ngram_bars(["neg\x8d", "pos"], [[(w, 1.0 - i / 20) for i, w in enumerate(words)], []]),
              tmp_path / "n.png")
        saved(pictures.attention_heatmaps([words], [torch.softmax(torch.rand(len(words), len(words)), -1)],
                                          [tweet[:40]]), tmp_path / "a.png")
        saved(pictures.ngram_bars(["a"], [[("$\\frac$", 1.0), ("$^$", 0.5)]]), tmp_path / "d.png")  # not mathtext
    labels = [t.get_text() for ax in (pictures.ngram_bars(["a"], [[(tweet, 1.0)]]).axes[0],)
              for t in ax.get_yticklabels()]
    assert labels == [pictures.display_text(tweet)] and "\x8d" not in labels[0]


def curve_info(stopping: bool) -> dict:
    rows = [{"epoch": e, "step": 10 * e, "lr": 0.01 if e < 4 else 0.005 * (5 - e), "train_loss": 1.0 / e,
             "val_loss": 1.2 / e, "val_accuracy": 0.5 + 0.1 * min(e, 3)} for e in range(1, 6)]
    info = {"history": {"metric": "accuracy", "rows": rows}}
    if stopping:
        info["stopping"] = {"stopped_epoch": 5, "stopped_step": 50, "kept_epoch": 5, "best_epoch": 3, "best_step": 30,
                            "best_val_accuracy": 0.8, "cooldown_step": 40}
    return info


def test_training_curves_mark_the_best_value_and_shade_the_cooldown(tmp_path):
    fig = pictures.training_curves({"classifier": curve_info(True), "text": curve_info(False), "old": {}})
    axes = fig.axes
    assert len(axes) == 6  # three rows for each model with a history; the one without is left out
    titles = [ax.get_title() for ax in axes if ax.get_title()]
    assert titles == ["classifier: stopped at epoch 5 (step 50),\nkept the weights of epoch 5", "text: 5 epochs as set"]
    star = [line for line in axes[0].get_lines() if line.get_marker() == "*"]
    assert len(star) == 1 and list(star[0].get_xdata()) == [30] and list(star[0].get_ydata()) == [0.8]
    shaded = [p for ax in axes for p in ax.patches]
    assert len(shaded) == 3  # the classifier's cooldown in each of its rows; the fixed-length text model has none
    assert shaded[0].get_x() == 40 and shaded[0].get_width() == 10
    assert saved(fig, tmp_path / "t.png")[:8] == PNG_MAGIC


def test_training_curves_without_any_history_say_why(tmp_path):
    fig = pictures.training_curves({"classifier": {}, "text": {"history": {"metric": "accuracy", "rows": []}}})
    assert "No training history" in fig.axes[0].texts[0].get_text()
    assert saved(fig, tmp_path / "n.png")[:8] == PNG_MAGIC
