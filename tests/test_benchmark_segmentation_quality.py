"""The thin-structure benchmark: figures per contender with the training time, each beside its target."""

from __future__ import annotations

from benchmarks.segmentation_quality import TARGET_DICE, TARGET_TRAIN_S, markdown, measure, met, verdict

TINY = {"data.segmentation.symmetries": "dihedral", "segmenter.crop_size": 32, "segmenter.batch_size": 4,
        "segmenter.epochs": 1, "segmenter.base_channels": 4, "segmenter.depth": 2}


def test_a_tiny_run_reports_dice_and_training_time_beside_the_targets():
    results = measure(10, 64, {"tiny": TINY})
    figures = results["contenders"]["tiny"]
    assert 0.0 <= figures["dice_boundary"] <= 1.0 and 0.0 <= figures["dice_cell"] <= 1.0
    assert 0 < figures["train_time_s"] <= figures["fit_wall_s"] and figures["fit_cpu_s"] > 0
    assert figures["epochs"] == 1 and figures["samples"]["train"] == 7
    report = markdown(results)
    assert f"boundary Dice (>= {TARGET_DICE})" in report and f"train s (<= {TARGET_TRAIN_S})" in report
    assert f"| tiny | {figures['dice_boundary']:.4f} | {figures['train_time_s']:.0f} |" in report


def test_the_target_needs_both_the_dice_and_the_time():
    good = {"dice_boundary": TARGET_DICE + 0.01, "train_time_s": TARGET_TRAIN_S - 1}
    assert met(good) and verdict(good).endswith(": met")
    assert not met({**good, "train_time_s": TARGET_TRAIN_S + 1})
    assert not met({**good, "dice_boundary": TARGET_DICE - 0.01})
    slow = verdict({**good, "train_time_s": TARGET_TRAIN_S + 1})
    assert f"(target <= {TARGET_TRAIN_S} s)" in slow and slow.endswith("MISSED")
