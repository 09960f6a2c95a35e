"""Tests for the readable summary of the reports printed after `scripts/repro`."""

from __future__ import annotations

import json

from trainlab.jobs.summary import summary_lines


def write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_summary_shows_headline_metrics_times_and_the_fastest_setting(tmp_path):
    write(tmp_path / "evaluate" / "metrics.json", {
        "classifier": {"accuracy": 0.985, "macro_f1": 0.98502},
        "segmenter": {"mean_iou": 0.9356, "pixel_accuracy": 0.9977},
        "text": {"accuracy": 0.762, "baseline_accuracy": 0.7546},
    })
    write(tmp_path / "classifier" / "run.json", {"timing": {"stage_time_s": 37.3}})
    write(tmp_path / "profile" / "measurements.json", {"classifier": {
        "fp32": {"train_samples_per_s": 736.0, "train_mfu": 0.815},
        "bf16_channels_last": {"train_samples_per_s": 1250.0, "train_mfu": 0.64},
    }, "device": {"matmul_peak_bf16_gflop_per_s": 434.8}})
    lines = summary_lines(tmp_path)
    classifier, segmenter, text = (next(line for line in lines if line.startswith(f"| {t} ")) for t in
                                   ("classifier", "segmenter", "text"))
    assert "accuracy 0.9850" in classifier and "37 s" in classifier
    assert "bf16_channels_last: 1,250 samples/s, MFU 64.0%" in classifier
    assert "mean IoU 0.9356" in segmenter and "samples/s" not in segmenter
    assert "TF-IDF baseline accuracy 0.7546" in text


def test_summary_of_a_pipeline_not_run_yet_says_so(tmp_path):
    lines = summary_lines(tmp_path / "missing")
    assert sum("not evaluated yet" in line for line in lines) == 3
