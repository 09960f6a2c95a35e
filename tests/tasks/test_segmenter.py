"""The segmentation task: random crops and symmetries move image and mask together; per-class metrics by name;
tiled inference; the segmenter learns thin structures from a few crops."""

from __future__ import annotations

import pytest
import torch

from trainlab.core.config import SegmenterParams
from trainlab.models.segmenter import build_segmenter, window_starts
from trainlab.tasks.augment import random_crop, random_symmetry
from trainlab.tasks.metrics import class_metric_keys
from trainlab.tasks.segmenter import segmentation_trainable


def paired(n=6, h=20, w=20):
    """Images whose pixel values encode their position, and masks that are a function of the image."""
    base = torch.arange(h * w, dtype=torch.int64).view(1, 1, h, w).repeat(n, 1, 1, 1) % 251
    images = (base + torch.arange(n).view(n, 1, 1, 1)).to(torch.uint8)
    masks = (images[:, 0] % 7).to(torch.uint8)
    return images, masks


def test_random_crop_takes_the_same_window_of_image_and_mask():
    images, masks = paired()
    gen = torch.Generator().manual_seed(0)
    ci, cm = random_crop([images, masks], 8, gen)
    assert ci.shape == (6, 1, 8, 8) and cm.shape == (6, 8, 8)
    assert torch.equal(cm, ci[:, 0] % 7)
    # each crop is a contiguous window of its own image
    for k in range(6):
        found = [(t, l) for t in range(13) for l in range(13) if torch.equal(images[k, :, t:t + 8, l:l + 8], ci[k])]
        assert found
    # different samples get different offsets, and the generator decides them
    again = random_crop([images, masks], 8, torch.Generator().manual_seed(0))
    assert torch.equal(again[0], ci)
    other = random_crop([images, masks], 8, torch.Generator().manual_seed(1))
    assert not torch.equal(other[0], ci)


def test_random_crop_pads_images_smaller_than_the_crop():
    images, masks = paired(h=6, w=10)
    ci, cm = random_crop([images, masks], 8, torch.Generator().manual_seed(0))
    assert ci.shape == (6, 1, 8, 8) and cm.shape == (6, 8, 8)


@pytest.mark.parametrize("symmetries,outcomes", [("none", 1), ("flips", 4), ("dihedral", 8)])
def test_symmetries_keep_pairs_and_reach_every_allowed_transform(symmetries, outcomes):
    images, masks = paired(n=64, h=5, w=5)
    images = images[:1].repeat(64, 1, 1, 1)
    masks = masks[:1].repeat(64, 1, 1)
    ti, tm = random_symmetry([images, masks], symmetries, torch.Generator().manual_seed(0))
    assert torch.equal(tm, ti[:, 0] % 7)
    distinct = {tuple(t.flatten().tolist()) for t in ti}
    assert len(distinct) == outcomes


def test_dihedral_on_non_square_images_only_flips():
    images, masks = paired(n=32, h=4, w=6)
    ti, tm = random_symmetry([images, masks], "dihedral", torch.Generator().manual_seed(0))
    assert ti.shape == images.shape and torch.equal(tm, ti[:, 0] % 7)


def test_train_batches_are_crops_and_eval_batches_whole_images():
    model = build_segmenter(SegmenterParams(base_channels=4, depth=1), num_classes=7, in_channels=1)
    task = segmentation_trainable(model, 7, crop_size=8, symmetries="dihedral")
    images, masks = paired()
    x, y = task.prepare_batch({"images": images, "masks": masks}, True, torch.Generator().manual_seed(0))
    assert x.shape == (6, 1, 8, 8) and y.shape == (6, 8, 8) and x.dtype == torch.float32
    x, y = task.prepare_batch({"images": images, "masks": masks}, False, None)
    assert x.shape == (6, 1, 20, 20) and torch.equal(y, masks.long())


def test_per_class_iou_and_dice_are_named_after_the_classes():
    model = build_segmenter(SegmenterParams(base_channels=4, depth=1), num_classes=3, in_channels=1)
    task = segmentation_trainable(model, 3, class_names=["background", "cell wall", "nucleus"])
    metrics = task.make_metrics()
    target = torch.tensor([[[0, 1, 2, 2]]])
    predicted = torch.tensor([[[0, 1, 2, 1]]])
    metrics.update(predicted, target)
    values = {k: float(v) for k, v in metrics.compute().items()}
    assert values["iou_background"] == 1.0 and values["dice_background"] == 1.0
    assert values["iou_cell_wall"] == pytest.approx(0.5) and values["dice_cell_wall"] == pytest.approx(2 / 3)
    assert values["iou_nucleus"] == pytest.approx(0.5) and values["dice_nucleus"] == pytest.approx(2 / 3)
    assert values["mean_iou"] == pytest.approx(2 / 3)


def test_validation_refuses_a_mask_value_out_of_range():
    # the validation metrics skip torchmetrics' argument checks (a third of the pass); the loss beside them checks
    from trainlab.core.runtime import Runtime
    from trainlab.engine.loop import evaluate

    model = build_segmenter(SegmenterParams(base_channels=4, depth=1), num_classes=7, in_channels=1)
    task = segmentation_trainable(model, 7)
    images, masks = paired()
    runtime = Runtime(torch.device("cpu"), "fp32", channels_last=False, compile=False, tf32=False, deterministic=True,
                      cudnn_benchmark=False)
    assert set(evaluate(task, model, {"images": images, "masks": masks}, runtime)) >= {"loss", "mean_iou"}
    masks[2, 3, 4] = 7
    with pytest.raises(IndexError, match="out of bounds"):
        evaluate(task, model, {"images": images, "masks": masks}, runtime)


def test_class_metric_keys_are_safe_and_unique():
    assert class_metric_keys(["a b", "a-b", "a b", "?"], 4) == ["a_b", "a-b", "a_b_2", "3"]
    assert class_metric_keys(None, 2) == ["0", "1"]


def test_window_starts_cover_the_image_and_end_flush():
    assert window_starts(64, 64, 48) == [0]
    assert window_starts(100, 64, 48) == [0, 36]
    assert window_starts(200, 64, 48) == [0, 48, 96, 136]


def test_tiled_inference_matches_whole_image_shape_and_is_used_only_in_eval():
    torch.manual_seed(0)
    # the framework's init: under kaiming the receptive field's far reach shows at 8 px from a tile's border
    tiled = build_segmenter(SegmenterParams(base_channels=4, depth=2, inference_tile=32, init="default"), 3, 1)
    whole = build_segmenter(SegmenterParams(base_channels=4, depth=2, init="default"), 3, 1)
    whole.load_state_dict(tiled.state_dict())
    x = torch.randn(2, 1, 80, 72)
    tiled.eval()
    whole.eval()
    with torch.no_grad():
        out = tiled(x)
        assert out.shape == (2, 3, 80, 72)
        # away from tile borders the receptive field is inside one tile: the centre of the first tile agrees
        torch.testing.assert_close(out[..., 8:16, 8:16], whole(x)[..., 8:16, 8:16], atol=1e-4, rtol=1e-4)
        small = torch.randn(1, 1, 32, 32)
        torch.testing.assert_close(tiled(small), whole(small))
    tiled.train()
    torch.testing.assert_close(tiled(x), whole.train()(x))


def test_learns_thin_structures_from_crops_of_a_few_images():
    """A small version of benchmarks/segmentation_quality: 12 training images, trained on crops with the dihedral
    symmetries, tested on whole unseen images; the boundary class must be found well beyond chance."""
    from trainlab.core.config import TrainParams
    from trainlab.core.repro import seed_everything
    from trainlab.core.runtime import Runtime
    from trainlab.data.thin_structures import CLASS_NAMES, thin_structure_set
    from trainlab.engine.loop import FitOptions, evaluate, fit, scalars

    images, masks = thin_structure_set(16, 64, seed=3)
    train = {"images": torch.from_numpy(images[:12]), "masks": torch.from_numpy(masks[:12])}
    test = {"images": torch.from_numpy(images[12:]), "masks": torch.from_numpy(masks[12:])}
    seed_everything(0)
    model = build_segmenter(SegmenterParams(base_channels=8, depth=2), num_classes=2, in_channels=1)
    task = segmentation_trainable(model, 2, dice_weight=1.0, crop_size=48,
                                  symmetries="dihedral", class_names=CLASS_NAMES)
    cfg = TrainParams(epochs=40, batch_size=6, lr=0.01, warmup_epochs=2, weight_decay=0.0)
    runtime = Runtime(torch.device("cpu"), "fp32", channels_last=False, compile=False, tf32=False, deterministic=True,
                      cudnn_benchmark=False)
    result = fit(task, train, test, cfg, runtime, seed=0, options=FitOptions(eval_batch_size=4))
    figures = scalars(evaluate(task, result.model, test, runtime, 4))
    assert figures["dice_boundary"] > 0.6, figures
    assert figures["dice_cell"] > 0.9, figures


def test_soft_dice_loss_is_the_one_hot_formula_to_the_bit_and_near_zero_for_a_perfect_prediction():
    import torch.nn.functional as F

    from trainlab.tasks.segmenter import soft_dice_loss

    torch.manual_seed(0)
    masks = torch.randint(0, 5, (4, 12, 12))
    for logits in (torch.randn(4, 5, 12, 12),
                   torch.randn(4, 5, 12, 12).to(memory_format=torch.channels_last).bfloat16()):
        logits.requires_grad_()
        probs = logits.float().softmax(dim=1)
        onehot = F.one_hot(masks, 5).permute(0, 3, 1, 2).to(probs.dtype)
        total = probs.sum(dim=(0, 2, 3)) + onehot.sum(dim=(0, 2, 3))
        expected = 1 - ((2 * (probs * onehot).sum(dim=(0, 2, 3)) + 1) / (total + 1)).mean()
        (expected_grad,) = torch.autograd.grad(expected, logits)
        loss = soft_dice_loss(logits, masks)
        (grad,) = torch.autograd.grad(loss, logits)
        assert torch.equal(loss, expected) and torch.equal(grad, expected_grad)
    perfect = F.one_hot(masks, 5).permute(0, 3, 1, 2).float() * 50
    assert float(soft_dice_loss(perfect, masks)) < 1e-3


def test_the_head_starts_at_the_class_prior_of_the_training_masks_in_memory_or_on_disk(tmp_path):
    from trainlab.data.prepared import ShardWriter
    from trainlab.data.shards import ShardSplit
    from trainlab.tasks.segmenter import SegmenterCode, class_prior

    masks = torch.zeros(6, 8, 8, dtype=torch.uint8)  # class 0 everywhere but 32 pixels of class 1; class 2 absent
    masks[1, :2] = 1
    masks[4, 5:7] = 1
    prior = class_prior(masks, 3)
    assert torch.allclose(prior, torch.tensor([353.0, 33.0, 1.0], dtype=torch.float64) / 387)
    writer = ShardWriter(tmp_path, "train", 64 + 64, shard_bytes=2 * 128)  # masks read lazily from three shards
    writer.add({"images": torch.zeros(6, 1, 8, 8, dtype=torch.uint8), "masks": masks})
    writer.close()
    assert torch.equal(class_prior(ShardSplit(tmp_path, "train")["masks"], 3), prior)
    assert torch.equal(class_prior(masks, 3, max_masks=2), class_prior(masks[[0, 5]], 3))  # evenly spaced rows

    model = build_segmenter(SegmenterParams(base_channels=4, depth=1), num_classes=3, in_channels=1)
    SegmenterCode().fit_statistics(model, {"masks": masks}, None)
    assert torch.allclose(model.head.bias.softmax(0).double(), prior, atol=1e-6)
    model.head.weight.data.zero_()
    assert torch.allclose(model(torch.rand(2, 1, 8, 8)).softmax(1)[0, :, 3, 3].double(), prior, atol=1e-6)
