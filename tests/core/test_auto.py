"""Training's auto values and budget resolved against the prepared data: batch sizes no larger than the data, steps
that follow its size, segmentation crops at the images' own resolution, the classifier's augmentation kind."""

from __future__ import annotations

import pytest
import torch

from trainlab.core.auto import AUTO_CROP, AUTO_TILE, resolve_training
from trainlab.core.config import ClassifierParams, SegmenterParams, TextParams
from trainlab.core.repro import generator
from trainlab.engine.batches import make_batches

SEG_META = {"num_classes": 2, "channels": 3}


def test_a_batch_larger_than_the_training_split_becomes_the_whole_split():
    cfg, choices = resolve_training("text", TextParams(batch_size=128, epochs=3), {}, 40)
    assert cfg.batch_size == 40 and choices["batch_size"]["value"] == 40 and "40 training samples" in \
        choices["batch_size"]["why"]
    cfg, choices = resolve_training("text", TextParams(batch_size=32), {}, 40)
    assert cfg.batch_size == 32 and "batch_size" not in choices


def test_a_number_of_epochs_is_trained_exactly_and_min_steps_bounds_epochs_auto_only():
    small, choices = resolve_training("text", TextParams(batch_size=10, epochs=2, min_steps=50), {}, 100)
    assert small.epochs == 2 and "epochs" not in choices and "min_steps" not in choices  # 20 steps, not raised
    auto, choices = resolve_training("text", TextParams(batch_size=10, min_steps=50), {}, 100)
    assert auto.schedule == "plateau" and auto.min_steps == 50 and auto.epochs == 100  # 10 steps an epoch
    large, _ = resolve_training("text", TextParams(batch_size=10, min_steps=50), {}, 10_000)
    assert large.min_steps == 50 and large.epochs == 100  # the ceiling: 100 epochs of 1,000 steps
    tiny, choices = resolve_training("text", TextParams(batch_size=10, min_steps=50_000), {}, 20)
    assert tiny.min_steps == 600 and "more than 300 epochs of 2 steps" in choices["min_steps"]["why"]


def test_large_images_train_on_crops_at_their_own_resolution():
    cfg, choices = resolve_training("segmenter", SegmenterParams(batch_size=32, epochs=6, min_steps=100),
                                    {**SEG_META, "height": 584, "width": 565}, 28)
    assert cfg.crop_size == AUTO_CROP and cfg.inference_tile is None
    assert cfg.crops_per_image == round(584 * 565 / AUTO_CROP**2) == cfg.epoch_repeats
    assert cfg.batch_size == 28 == choices["batch_size"]["value"]
    assert cfg.epochs == 6  # trained exactly: 6 epochs of 20 crops
    small, choices = resolve_training("segmenter", SegmenterParams(batch_size=32), {**SEG_META, "height": 48,
                                                                                   "width": 48}, 3500)
    assert small.crop_size is None and small.epoch_repeats == 1 and small.inference_tile is None
    assert choices["crop_size"]["value"] is None
    huge, choices = resolve_training("segmenter", SegmenterParams(), {**SEG_META, "height": 1500, "width": 2000}, 9)
    assert huge.inference_tile == AUTO_TILE and "tiles" in choices["inference_tile"]["why"]
    mine, choices = resolve_training("segmenter", SegmenterParams(crop_size=64, crops_per_image=2, inference_tile=None),
                                     {**SEG_META, "height": 584, "width": 565}, 28)
    assert (mine.crop_size, mine.crops_per_image, mine.inference_tile) == (64, 2, None)


def test_the_classifier_augmentation_follows_what_prepare_found_the_images_to_be():
    photos = {"num_classes": 2, "channels": 3, "augment": "photo",
              "auto": {"augment": {"value": "photo", "why": "colour images of 758 sizes (photos)"}}}
    cfg, choices = resolve_training("classifier", ClassifierParams(), photos, 1000)
    assert cfg.augment == "photo" and choices["augment"]["why"].startswith("colour images")
    cfg, _ = resolve_training("classifier", ClassifierParams(), {"num_classes": 10, "channels": 1}, 1000)
    assert cfg.augment == "shift"  # data prepared before the record: never photo crops
    cfg, choices = resolve_training("classifier", ClassifierParams(augment="none"), photos, 1000)
    assert cfg.augment == "none" and not cfg.augments and "augment" not in choices


def test_augment_takes_the_old_booleans():
    assert ClassifierParams(augment=True).augment == "auto" and ClassifierParams(augment=False).augment == "none"
    with pytest.raises(ValueError):
        ClassifierParams(augment="mirror")


def test_repeats_draw_every_sample_that_many_times_an_epoch_and_one_is_the_old_order():
    data = {"x": torch.arange(10)}
    once = make_batches(data, 4, torch.device("cpu"), 3, shuffle=True, drop_last=True, max_device_mb=64)
    thrice = make_batches(data, 4, torch.device("cpu"), 3, shuffle=True, drop_last=True, max_device_mb=64, repeats=3)
    assert len(once) == 2 and len(thrice) == 7
    drawn = torch.cat([b["x"] for b in thrice.epoch(0)])
    assert torch.bincount(drawn, minlength=10).max() <= 3 and len(drawn) == 28
    old = torch.randperm(10, generator=generator(3, "shuffle", 0))[:8]  # the order before repeats existed
    assert torch.equal(torch.cat([b["x"] for b in once.epoch(0)]), old)


def test_evaluation_batches_of_large_images_stay_within_a_pixel_budget():
    from trainlab.engine.batches import EVAL_MAX_PIXELS, eval_batch_size

    small = {"images": torch.zeros(4, 1, 28, 28, dtype=torch.uint8), "labels": torch.zeros(4, dtype=torch.long)}
    large = {"images": torch.zeros(4, 3, 584, 565, dtype=torch.uint8), "masks": torch.zeros(4, 584, 565)}
    assert eval_batch_size(small, 512) == 512
    assert eval_batch_size(large, 256) == EVAL_MAX_PIXELS // (584 * 565) < 256
    assert eval_batch_size({"tokens": torch.zeros(4, 48, dtype=torch.long)}, 256) == 256


PHOTOS = {"num_classes": 2, "channels": 3, "height": 96, "width": 96, "augment": "photo"}
DIGITS = {"num_classes": 10, "channels": 1, "height": 28, "width": 28, "augment": "shift"}


def test_photos_get_cutmix_a_stride_4_stem_and_a_longer_budget_and_digits_none_of_them():
    from trainlab.core.auto import CUTMIX_STEPS, MIN_STEPS

    photos, choices = resolve_training("classifier", ClassifierParams(), PHOTOS, 840)
    assert (photos.cutmix, photos.stem_pool, photos.min_steps) == (True, 4, MIN_STEPS * CUTMIX_STEPS)
    assert photos.epochs * (840 // photos.batch_size) >= MIN_STEPS * CUTMIX_STEPS  # the ceiling
    assert "24x24" in choices["stem_pool"]["why"] and "CutMix" in choices["min_steps"]["why"]
    digits, choices = resolve_training("classifier", ClassifierParams(), DIGITS, 3500)
    assert (digits.cutmix, digits.stem_pool, digits.min_steps) == (False, 2, MIN_STEPS)
    assert "14x14" in choices["stem_pool"]["why"] and choices["cutmix"]["value"] is False


def test_a_set_value_is_kept_and_cutmix_off_keeps_the_short_budget():
    cfg, choices = resolve_training("classifier", ClassifierParams(cutmix=False, stem_pool=1), PHOTOS, 840)
    assert (cfg.cutmix, cfg.stem_pool, cfg.min_steps) == (False, 1, 480)
    assert "cutmix" not in choices and "stem_pool" not in choices
    cfg, _ = resolve_training("classifier", ClassifierParams(augment="photo", min_steps=100), DIGITS, 3500)
    assert cfg.cutmix is True and cfg.min_steps == 100 and cfg.epochs == 100


def test_cutmix_pastes_a_box_from_the_next_sample_and_mixes_the_targets_by_its_area():
    from trainlab.tasks.augment import random_cutmix

    images = torch.arange(6.0).view(6, 1, 1, 1).expand(6, 3, 16, 16).contiguous()
    labels = torch.tensor([0, 1, 2, 3, 4, 0])
    mixed, targets = random_cutmix(images, labels, 5, torch.Generator().manual_seed(0))
    assert mixed.shape == images.shape and targets.shape == (6, 5)
    assert torch.allclose(targets.sum(1), torch.ones(6))
    for i in range(6):
        own = (mixed[i] == images[i]).float().mean()
        assert set(mixed[i].unique().tolist()) <= {float(i), float((i - 1) % 6)}  # its own and the previous sample's
        expected = torch.zeros(5)
        expected[labels[i]] += own
        expected[labels[i - 1]] += 1 - own
        assert torch.allclose(targets[i], expected)
    again, _ = random_cutmix(images, labels, 5, torch.Generator().manual_seed(0))
    assert torch.equal(mixed, again)


def test_text_weight_decay_auto_is_the_bags_candidates_or_the_archs_value():
    from trainlab.core.auto import AUTO_WEIGHT_DECAY, WEIGHT_DECAY_CANDIDATES

    bag, choices = resolve_training("text", TextParams(), {}, 1000)
    assert bag.weight_decay == WEIGHT_DECAY_CANDIDATES and bag.optimizer_weight_decay == 0.0
    assert "validation split chooses" in choices["weight_decay"]["why"]
    encoder, choices = resolve_training("text", TextParams(arch="transformer"), {}, 1000)
    assert encoder.weight_decay == AUTO_WEIGHT_DECAY["transformer"] == encoder.optimizer_weight_decay
    mine, choices = resolve_training("text", TextParams(weight_decay=0.2), {}, 1000)
    assert mine.weight_decay == 0.2 and "weight_decay" not in choices


def test_nothing_outside_the_resolver_compares_a_value_with_auto():
    """The one resolver (trainlab.core.auto) is the only code that decides what an `auto` means."""
    import ast
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    found = []
    for path in sorted([*repo.glob("trainlab/**/*.py"), *repo.glob("stages/*.py"), *repo.glob("pipelines/*.py")]):
        if path.name == "auto.py" and path.parent.name == "core":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(isinstance(c, ast.Constant) and c.value == "auto"
                                                     for c in [node.left, *node.comparators]):
                found.append(f"{path.relative_to(repo)}:{node.lineno}")
    assert not found, "compared with 'auto' outside trainlab/core/auto.py: " + ", ".join(found)
