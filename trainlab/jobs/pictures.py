"""Evaluation pictures as matplotlib figures (Agg): misclassified grid, segmentation masks, attention, feature maps,
training curves."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from trainlab.core.atomic import atomic_path

GRID_COLUMNS = 8
BACKGROUND_COLOUR = (0.08, 0.08, 0.08, 1.0)


def new_figure(width: float, height: float) -> Figure:
    """A figure on the Agg canvas (no pyplot, no display, no global state)."""
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Write a figure as PNG atomically."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    return Path(path)


def image_array(image: torch.Tensor) -> np.ndarray:
    """(C, H, W) uint8 -> (H, W) for one channel or (H, W, C) for three."""
    array = image.detach().cpu().numpy()
    return array[0] if array.shape[0] == 1 else np.moveaxis(array[:3], 0, -1)


def display_text(text: str) -> str:
    """Text from the data as a picture shows it: non-printable characters (the C0/C1 controls of a mis-decoded tweet,
    such as \\x8d) dropped, line breaks and other spaces as a space, `$` escaped. The font has no glyph for a control
    character (matplotlib warns for each), and two `$` would start mathtext, which can fail to parse."""
    shown = "".join(c if c.isprintable() else " " if c.isspace() else "" for c in str(text))
    return shown.replace("$", r"\$")


def show_image(ax, image: torch.Tensor) -> None:
    ax.imshow(image_array(image), cmap="gray", vmin=0, vmax=255, interpolation="nearest")
    ax.set_axis_off()


def message_figure(text: str) -> Figure:
    """A picture that says why there is nothing to draw, wrapped to fit its width."""
    fig = new_figure(6, 1.5)
    ax = fig.add_subplot()
    ax.text(0.5, 0.5, textwrap.fill(text, 60), ha="center", va="center", fontsize=11)
    ax.set_axis_off()
    return fig


# --------------------------------------------------------------------------------------------------------------------


def misclassified_grid(images: torch.Tensor, actual: torch.Tensor, predicted: torch.Tensor, class_names: Sequence[str],
                       indices: torch.Tensor | None = None, total_wrong: int | None = None,
                       total: int | None = None) -> Figure:
    """Misclassified test images in a grid, each titled with its true and predicted class."""
    count = len(images)
    total_wrong = count if total_wrong is None else total_wrong
    if count == 0:
        return message_figure(f"No misclassified test images (of {total or 0}).")
    cols = min(GRID_COLUMNS, count)
    rows = math.ceil(count / cols)
    fig = new_figure(1.4 * cols, 1.55 * rows + 0.4)
    axes = fig.subplots(rows, cols, squeeze=False)
    for k, ax in enumerate(axes.flat):
        if k >= count:
            ax.set_axis_off()
            continue
        show_image(ax, images[k])
        where = f"#{int(indices[k])} " if indices is not None else ""
        true, pred = (display_text(class_names[int(i)]) for i in (actual[k], predicted[k]))
        ax.set_title(f"{where}true {true}\npred {pred}", fontsize=8, color="firebrick")
    of = f" of {total}" if total is not None else ""
    fig.suptitle(f"Misclassified test images: {count} shown, {total_wrong} wrong{of}", fontsize=10)
    return fig


def class_colours(class_names: Sequence[str]) -> ListedColormap:
    """A fixed colour per class index: near-black for a 'background' class 0, qualitative colours for the rest."""
    n = len(class_names)
    background = bool(n) and class_names[0].lower() == "background"
    palette = colormaps["tab10" if n - background <= 10 else "tab20"]
    colours = [palette(i % palette.N) for i in range(n - background)]
    return ListedColormap([BACKGROUND_COLOUR] * background + colours, name="classes")


def segmentation_overlays(images: torch.Tensor, masks: torch.Tensor, predicted: torch.Tensor,
                          class_names: Sequence[str]) -> Figure:
    """For each canvas: the image, the true mask and the predicted mask, coloured by class, with a legend."""
    count, n = len(images), len(class_names)
    if count == 0:
        return message_figure("No test canvases.")
    cmap = class_colours(class_names)
    fig = new_figure(7.5, 2.4 * count + 0.9)
    axes = fig.subplots(count, 3, squeeze=False)
    for k in range(count):
        show_image(axes[k, 0], images[k])
        wrong = int((predicted[k] != masks[k]).sum())
        for ax, mask, title in ((axes[k, 1], masks[k], "truth"), (axes[k, 2], predicted[k], "prediction")):
            ax.imshow(mask.detach().cpu().numpy(), cmap=cmap, vmin=-0.5, vmax=n - 0.5, interpolation="nearest")
            ax.set_axis_off()
            ax.set_title(title if title == "truth" else f"{title} ({wrong} of {masks[k].numel()} pixels wrong)",
                         fontsize=9)
        axes[k, 0].set_title(f"test canvas {k}", fontsize=9)
    handles = [Patch(facecolor=cmap(i), edgecolor="0.5", label=display_text(name))
               for i, name in enumerate(class_names)]
    fig.legend(handles=handles, loc="outside lower center", ncols=min(n, 6), fontsize=8, frameon=False)
    return fig


def attention_heatmaps(tokens: Sequence[Sequence[str]], attentions: Sequence[torch.Tensor],
                       titles: Sequence[str] | None = None, empty: str = "No test texts.") -> Figure:
    """One heatmap per text: attention from each token (rows, queries) to each token (columns, keys)."""
    count = len(tokens)
    if count == 0:
        return message_figure(empty)
    cols = min(2, count)
    rows = math.ceil(count / cols)
    fig = new_figure(6 * cols, 6 * rows)
    axes = fig.subplots(rows, cols, squeeze=False)
    for k, ax in enumerate(axes.flat):
        if k >= count:
            ax.set_axis_off()
            continue
        words, att = [display_text(w) for w in tokens[k]], attentions[k].detach().cpu().numpy()
        image = ax.imshow(att, cmap="viridis", vmin=0, interpolation="nearest")
        size = max(4.0, min(9.0, 220 / max(len(words), 1)))
        ax.set_xticks(range(len(words)), words, rotation=90, fontsize=size)
        ax.set_yticks(range(len(words)), words, fontsize=size)
        ax.set_xlabel("attended token (key)", fontsize=8)
        ax.set_ylabel("attending token (query)", fontsize=8)
        ax.set_title(display_text(titles[k]) if titles else f"test text {k}", fontsize=9)
        fig.colorbar(image, ax=ax, shrink=0.7)
    fig.suptitle("Last-layer self-attention, mean over heads", fontsize=11)
    return fig


def ngram_bars(class_names: Sequence[str], ngrams: Sequence[Sequence[tuple[str, float]]],
               empty: str = "No n-grams.") -> Figure:
    """One horizontal bar chart per class: its most weighted n-grams (largest at the top)."""
    shown = [(name, rows) for name, rows in zip(class_names, ngrams) if rows]
    if not shown:
        return message_figure(empty)
    cols = min(3, len(shown))
    rows_n = math.ceil(len(shown) / cols)
    longest = max(len(rows) for _, rows in shown)
    fig = new_figure(4.5 * cols, 0.28 * longest * rows_n + 1.2 * rows_n)
    axes = fig.subplots(rows_n, cols, squeeze=False)
    for k, ax in enumerate(axes.flat):
        if k >= len(shown):
            ax.set_axis_off()
            continue
        name, rows = shown[k]
        labels, values = [display_text(r[0]) for r in rows][::-1], [r[1] for r in rows][::-1]
        ax.barh(range(len(rows)), values, color="tab:blue")
        ax.set_yticks(range(len(rows)), labels, fontsize=7)
        ax.tick_params(axis="x", labelsize=7)
        ax.set_title(f"class {display_text(name)}", fontsize=9)
    fig.suptitle("Most weighted n-grams per class (logit added, relative to the mean over classes)", fontsize=10)
    return fig


def feature_map_grid(images: torch.Tensor, features: dict[str, torch.Tensor]) -> Figure:
    """Rows: test images; columns: the input, then the first channels of each chosen layer's feature map."""
    count = len(images)
    if count == 0 or not features:
        return message_figure("No feature maps.")
    columns = [(None, 0)] + [(name, c) for name, maps in features.items() for c in range(maps.shape[1])]
    fig = new_figure(1.3 * len(columns), 1.4 * count + 0.5)
    axes = fig.subplots(count, len(columns), squeeze=False)
    for k in range(count):
        for j, (name, channel) in enumerate(columns):
            ax = axes[k, j]
            if name is None:
                show_image(ax, images[k])
            else:
                ax.imshow(features[name][k, channel].numpy(), cmap="magma", interpolation="nearest")
                ax.set_axis_off()
            if k == 0:
                ax.set_title("input" if name is None else f"{name}\nch {channel}", fontsize=7)
    fig.suptitle("Classifier feature maps (each map scaled to its own range)", fontsize=10)
    return fig


def training_curves(runs: dict[str, dict]) -> Figure:
    """One column per model, over optimizer steps: its primary validation metric (the best value starred), the
    training and validation loss, the learning rate; the plateau schedule's cooldown shaded. `runs`: a model's name ->
    its info.json ("history": trainlab.jobs.train.curve_rows, "stopping": the plateau schedule's record, if any)."""
    shown = {name: info for name, info in runs.items() if info.get("history", {}).get("rows")}
    if not shown:
        return message_figure("No training history in the models' info.json (trained by an older version): "
                              "train again to see the curves")
    fig = new_figure(4.2 * len(shown), 7.5)
    axes = fig.subplots(3, len(shown), sharex="col", squeeze=False)
    for column, (name, info) in enumerate(shown.items()):
        rows, metric, stop = info["history"]["rows"], info["history"]["metric"], info.get("stopping") or {}
        steps = [row["step"] for row in rows]
        top, middle, bottom = axes[:, column]
        top.plot(steps, [row.get(f"val_{metric}", np.nan) for row in rows], marker="o", markersize=3)
        top.set_ylabel(f"validation {metric}")
        if stop.get(f"best_val_{metric}") is not None:
            top.plot([stop["best_step"]], [stop[f"best_val_{metric}"]], marker="*", markersize=12, linestyle="none",
                     color="tab:orange", label=f"best {stop[f'best_val_{metric}']:.4f} (epoch {stop['best_epoch']})")
            top.legend(fontsize=7, loc="lower right")
        middle.plot(steps, [row.get("train_loss", np.nan) for row in rows], label="training")
        middle.plot(steps, [row.get("val_loss", np.nan) for row in rows], label="validation")
        middle.set_ylabel("loss")
        middle.legend(fontsize=7)
        bottom.plot(steps, [row.get("lr", np.nan) for row in rows], marker="o", markersize=3)
        bottom.set_ylabel("learning rate")
        bottom.set_xlabel("optimizer step")
        if stop.get("cooldown_step") is not None:
            for ax in axes[:, column]:
                ax.axvspan(stop["cooldown_step"], stop["stopped_step"], color="tab:blue", alpha=0.1, linewidth=0)
        top.set_title(f"{name}: " + (f"stopped at epoch {stop['stopped_epoch']} (step {stop['stopped_step']:,}),\n"
                                     f"kept the weights of epoch {stop['kept_epoch']}"
                                     if stop else f"{rows[-1]['epoch']:.0f} epochs as set"), fontsize=9)
    fig.suptitle("Training curves (shaded: the cooldown after the validation plateau; one point per validation)",
                 fontsize=10)
    return fig


# picture kind (what a task's evaluation returns, trainlab.tasks.base.TaskCode.pictures) -> the function drawing it
DRAW = {
    "misclassified": misclassified_grid,
    "segmentation": segmentation_overlays,
    "attention": attention_heatmaps,
    "feature_maps": feature_map_grid,
    "ngrams": ngram_bars,
}
