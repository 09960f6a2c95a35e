"""trainlab.profiling: FLOP counts against formulas, peaks, the settings matrix, timing, memory and traces."""

from __future__ import annotations

import dataclasses
import json
import math
import mmap
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from trainlab.core.config import BaseParams, ClassifierParams, Params, TrainParams
from trainlab.core.runtime import Runtime, resolve_runtime
from trainlab.profiling.flops import ELEMENTWISE, MATMUL, count_flops, flops_per_step
from trainlab.profiling.memory import PeakMemory
from trainlab.profiling.peaks import datasheet_peak_flops, datasheet_peak_for_name, matmul_peak_flops
from trainlab.profiling.report import DeviceProfile, ModelProfile, derived, markdown_report, metrics_dict
from trainlab.profiling.throughput import make_steps, measure_steps, setting_name, settings_matrix, time_step
from trainlab.profiling.traces import trace_step


def cpu_runtime(**changes) -> Runtime:
    base = Runtime(device=torch.device("cpu"), precision="fp32", channels_last=False, compile=False, tf32=False,
                   deterministic=True, cudnn_benchmark=False)
    return dataclasses.replace(base, **changes)


def tiny_classifier_trainable():
    from trainlab.jobs.train import build_trainable

    params = Params(classifier=ClassifierParams(width=8))
    return build_trainable("classifier", params, {"num_classes": 10, "channels": 1})


def image_batch(n: int = 8) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"images": torch.randint(0, 256, (n, 1, 28, 28), dtype=torch.uint8, generator=g),
            "labels": torch.randint(0, 10, (n,), generator=g)}


# --- FLOPs -------------------------------------------------------------------------------------------------------


def test_linear_flops_match_the_formula():
    n, fan_in, fan_out = 32, 64, 48
    layer = nn.Linear(fan_in, fan_out)
    x = torch.randn(n, fan_in)
    assert count_flops(lambda: layer(x)) == 2 * n * fan_in * fan_out
    # backward: grad of the input and of the weight, each another 2*N*in*out
    x.requires_grad_(True)
    assert count_flops(lambda: layer(x).sum().backward()) == 3 * 2 * n * fan_in * fan_out


def test_cpu_attention_kernel_is_counted():
    b, h, length, d = 2, 4, 16, 8
    q, k, v = (torch.randn(b, h, length, d) for _ in range(3))
    mask = torch.ones(b, 1, 1, length, dtype=torch.bool)
    with torch.no_grad():
        flops = count_flops(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert flops == 2 * (2 * b * h * length * length * d)  # q @ k^T and att @ v


def test_flops_per_step_extrapolates_exactly():
    task = tiny_classifier_trainable()
    batch = image_batch(8)
    flops = flops_per_step(task, batch)
    model = task.model.train()
    x = batch["images"].float()
    full_infer = count_flops(lambda: model.eval()(x))
    assert flops["infer"] == full_infer
    assert 2.0 < flops["train"] / flops["infer"] <= 3.0  # no input gradient for the first conv
    assert all(p.grad is None for p in task.model.parameters())


def test_flops_of_a_pooled_classifier_on_images_that_end_at_1x1_are_counted_and_exact():
    """8x8 images through a pooled classifier end at 1x1: one sample leaves a training BatchNorm one value per
    channel (an error), so the count takes 2 and 3 samples, and extrapolates exactly."""
    from trainlab.jobs.train import build_trainable

    params = Params(classifier=ClassifierParams(width=8, stem_pool=2))
    task = build_trainable("classifier", params, {"num_classes": 10, "channels": 1})
    batch = {"images": torch.randint(0, 256, (6, 1, 8, 8), dtype=torch.uint8), "labels": torch.arange(6) % 10}
    flops = flops_per_step(task, batch)
    x = batch["images"].float()
    assert flops["infer"] == count_flops(lambda: task.model.eval()(x))
    for n in (2, 3):
        assert flops_per_step(task, {k: v[:n] for k, v in batch.items()})["infer"] == \
            count_flops(lambda n=n: task.model.eval()(x[:n]))
    assert 2.0 < flops["train"] / flops["infer"] <= 3.0


V, C, L, N = 30, 8, 6, 4  # the text bags' tiny input: vocabulary, classes, tokens per text, texts


def text_trainable(model: nn.Module):
    """What flops_per_step uses of a text Trainable: the model, its batch (token ids) and its loss."""
    from types import SimpleNamespace

    return SimpleNamespace(model=model, prepare_batch=lambda batch, train, _: (batch["tokens"], batch["labels"]),
                           loss_fn=F.cross_entropy)


def text_batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, V, (N, L), generator=g)
    tokens[0, 4:] = 0  # a short text: padded
    return {"tokens": tokens, "labels": torch.randint(0, C, (N,), generator=g)}


def test_embedding_bag_flops_match_the_hand_count():
    from trainlab.models.ngram_bag import NBNgramBag, NgramBag

    batch, dim = text_batch(), 8
    bag = NgramBag(V, C, L, dim=dim, buckets=16)
    k = bag.ids(batch["tokens"]).size(1)  # the words and their hashed bigrams, padding included
    flops = flops_per_step(text_trainable(bag), batch)
    # forward: the mean of k rows (an add per row and column, a divide per column) and the linear head
    forward = N * k * dim + N * dim + 2 * N * dim * C
    # backward: the head's weight and input gradients, and each row's gradient scaled by 1 / bag size and added
    assert (flops["infer"], flops["train"], flops.basis) == (forward, forward + 4 * N * dim * C + 2 * N * k * dim,
                                                              MATMUL)
    nb = NBNgramBag(V, C, L, buckets=16)  # F.embedding_bag with per_sample_weights: a multiply and an add per row
    assert flops_per_step(text_trainable(nb), batch) == {"train": 4 * N * k * C, "infer": 2 * N * k * C}


def test_the_tfidf_bag_is_counted_by_its_multiplies_and_adds():
    """The TF-IDF bag gathers weight rows (index_select), scales them and sums them: no matmul or embedding bag, so
    its floating-point multiplies and adds are counted, near the hand count of its weighted row sum."""
    from trainlab.models.tfidf_bag import TfidfBag

    batch = text_batch()
    bag = TfidfBag(V, C, L, buckets=16, char_buckets=16)
    bag.fit_vocabulary([f"w{i}" for i in range(V)])
    bag.fit_idf(batch["tokens"])
    slots = bag.word_ids(batch["tokens"]).size(1) + bag.char_ids(batch["tokens"]).size(1)
    flops = flops_per_step(text_trainable(bag), batch)
    assert flops.basis == ELEMENTWISE
    weighted_sum = 2 * N * slots * C  # a multiply and an add per slot and class
    # on top: the features' L2 normalisation, a few operations per slot (not per class), and the bias
    assert weighted_sum < flops["infer"] < weighted_sum * (1 + 1.5 / C)
    # backward: the output gradient scaled per slot and added into the weight's rows: as much again
    assert 2 * weighted_sum < flops["train"] < 2 * weighted_sum * (1 + 1.5 / C)


def test_integer_arithmetic_is_not_counted():
    ids = torch.arange(1000)
    assert count_flops(lambda: ids * 3 + 1, elementwise=True) == 0
    assert count_flops(lambda: ids.float() * 3 + 1, elementwise=True) == 2000


# --- peaks -------------------------------------------------------------------------------------------------------


def test_matmul_peak_on_cpu_is_positive():
    peak = matmul_peak_flops("cpu", torch.float32, repeats=2, sizes=(64, 128))
    assert math.isfinite(peak) and peak > 1e6


@pytest.mark.parametrize(("name", "key", "tflops"), [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
    ("NVIDIA H200", "bf16", 989.4),
    ("NVIDIA H100 PCIe", "bf16", 756.0),
    ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
    ("NVIDIA A100-SXM4-80GB", "tf32", 156.0),
    ("NVIDIA L4", "bf16", 121.0),
    ("NVIDIA L40S", "bf16", 362.1),
    ("Tesla T4", "fp16", 65.0),
])
def test_datasheet_peaks_match_by_name(name, key, tflops):
    assert datasheet_peak_for_name(name, key) == pytest.approx(tflops * 1e12)


def test_datasheet_peak_unknown_or_cpu_is_none():
    assert datasheet_peak_for_name("Some Future GPU", "bf16") is None
    assert datasheet_peak_for_name("Tesla T4", "bf16") is None
    assert datasheet_peak_flops("cpu", "bf16") is None


# --- settings, timing, throughput ----------------------------------------------------------------------------------


def test_settings_matrix(monkeypatch):
    from trainlab.profiling import throughput

    monkeypatch.setattr(throughput, "cpu_supports_bf16", lambda: True)
    base = cpu_runtime(precision="bf16", channels_last=True)
    assert list(settings_matrix(base, conv=True, compile=False)) == [
        "fp32", "fp32_channels_last", "bf16", "bf16_channels_last"]
    assert list(settings_matrix(base, conv=False, compile=True)) == ["fp32", "bf16", "bf16_compile"]
    monkeypatch.setattr(throughput, "cpu_supports_bf16", lambda: False)
    assert list(settings_matrix(base, conv=True, compile=True)) == [
        "fp32", "fp32_channels_last", "fp32_channels_last_compile"]
    assert setting_name(cpu_runtime(channels_last=True), conv=False) == "fp32"


def test_settings_matrix_used_is_the_training_setting_and_plain_fp32():
    bf16 = cpu_runtime(precision="bf16", channels_last=True)
    assert list(settings_matrix(bf16, conv=True, compile=False, which="used")) == ["fp32", "bf16_channels_last"]
    assert list(settings_matrix(bf16, conv=False, compile=True, which="used")) == ["fp32", "bf16", "bf16_compile"]
    fp32 = cpu_runtime(precision="fp32", channels_last=True)
    assert list(settings_matrix(fp32, conv=True, compile=False, which="used")) == ["fp32", "fp32_channels_last"]
    # the training setting is the baseline itself: measured once
    assert list(settings_matrix(fp32, conv=False, compile=False, which="used")) == ["fp32"]
    with pytest.raises(ValueError, match="settings"):
        settings_matrix(fp32, conv=True, compile=False, which="some")


def test_time_step_fits_a_budget():
    calls = []

    def slow_step():
        calls.append(1)
        time.sleep(0.05)

    timing = time_step(slow_step, torch.device("cpu"), steps=10, warmup=5, repeats=2, budget_s=0.4)
    assert 1 <= timing.warmup_steps < 5
    assert 1 <= timing.steps <= 3
    assert len(timing.per_step) == 2 and all(t >= 0.045 for t in timing.per_step)
    assert len(calls) == timing.warmup_steps + 2 * timing.steps
    full = time_step(lambda: None, torch.device("cpu"), steps=4, warmup=2, repeats=3)
    assert (full.steps, full.warmup_steps, len(full.per_step)) == (4, 2, 3)


def test_measuring_runs_the_real_step_on_a_copy():
    task = tiny_classifier_trainable()
    before = {k: v.clone() for k, v in task.model.state_dict().items()}
    batch = image_batch(8)
    built = make_steps(task, cpu_runtime(channels_last=True), batch, TrainParams(lr=0.1), seed=0)
    result = measure_steps(built, torch.device("cpu"), 8, steps=2, warmup=1, repeats=2)
    for phase in ("train", "infer"):
        assert result[f"{phase}_samples_per_s"] > 0
        assert result[f"{phase}_step_ms"] > 0
        assert result[f"{phase}_peak_memory_mb"] > 0
        assert result[f"{phase}_steps"] == 2 and result[f"{phase}_warmup_steps"] == 1
    after = task.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_make_steps_updates_the_weights():
    from trainlab.profiling.throughput import make_steps

    task = tiny_classifier_trainable()
    built = make_steps(task, resolve_runtime(BaseParams(device="cpu", precision="fp32")), image_batch(8),
                       TrainParams(lr=0.1))
    before = [p.detach().clone() for p in built.model.parameters()]
    built.train()
    assert any(not torch.equal(a, b) for a, b in zip(before, built.model.parameters(), strict=True))
    assert built.model is not task.model


# --- memory, traces, report ----------------------------------------------------------------------------------------


def test_peak_memory_sees_a_large_allocation():
    with PeakMemory(torch.device("cpu")) as idle:
        time.sleep(0.02)
    with PeakMemory(torch.device("cpu")) as busy:
        # 64 MB of fresh anonymous pages, every one touched: a torch or malloc buffer may reuse memory that an
        # earlier test freed and that is still resident, and then RSS does not move (seen once in a full suite)
        big = mmap.mmap(-1, 64 * 2**20)
        big.write(b"\1" * len(big))
        time.sleep(0.3)  # long enough for the sampler thread to run on a busy machine
        big.close()
    assert busy.peak_mb >= idle.peak_mb + 48


def test_trace_step_writes_chrome_trace_and_top_ops(tmp_path):
    layer = nn.Linear(16, 16)
    x = torch.randn(4, 16)
    trace_step(lambda: layer(x).sum().backward(), torch.device("cpu"), tmp_path / "t.json", tmp_path / "ops.txt",
               title="linear")
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    text = (tmp_path / "ops.txt").read_text()
    assert text.startswith("linear") and "aten::addmm" in text


def test_metrics_and_report_layout():
    device = DeviceProfile("cpu", "test cpu", 2, "process_rss", {"fp32": 1e11}, {}, torch.__version__)
    m = {"train_samples_per_s": 100.0, "infer_samples_per_s": 300.0, "train_step_ms": 80.0, "infer_step_ms": 26.7,
         "train_gflop_per_step": 1.0, "infer_gflop_per_step": 0.34, "train_achieved_gflop_per_s": 12.5,
         "infer_achieved_gflop_per_s": 12.75, "train_mfu": 0.125, "infer_mfu": 0.1275, "train_peak_memory_mb": 900,
         "infer_peak_memory_mb": 850, "train_spread": 0.05, "infer_spread": 0.1, "train_steps": 5,
         "infer_steps": 5, "train_warmup_s": 0.3, "train_warmup_steps": 3}
    model = ModelProfile("classifier", "resnet_small", 1000, {"train": 10**9, "infer": 34 * 10**7},
                         settings={"fp32": m})
    metrics = metrics_dict(device, [model], 12.345)
    assert metrics["classifier"]["fp32"]["train_mfu"] == 0.125
    assert "train_steps" not in metrics["classifier"]["fp32"]  # run details stay in the report
    assert metrics["device"]["matmul_peak_fp32_gflop_per_s"] == 100.0
    report = markdown_report(device, [model], 8, 5, 3, 3, 12.3)
    assert "| `fp32` | 100 | 300 |" in report and "12.5%" in report
    assert "1 GFLOP per training step" in report and "MFU does not apply" not in report
    # a model whose FLOPs were not counted at all: n/a with the reason, never 0 GFLOP or an MFU of 0
    timed = {k: v for k, v in m.items() if "gflop" not in k and "mfu" not in k}  # what measure_steps gives
    bag = ModelProfile("text", "tfidf_bag", 1000, {"train": 0, "infer": 0},
                       settings={"fp32": derived(timed, {"train": 0, "infer": 0}, 8, 1e11, None)})
    bag_report = markdown_report(device, [bag], 8, 5, 3, 3, 12.3)
    assert "MFU does not apply (n/a)" in bag_report and "0 GFLOP" not in bag_report
    assert "| `fp32` | 100 | 300 | 80 | n/a | n/a | n/a |" in bag_report
    assert "train_mfu" not in metrics_dict(device, [bag], 1.0)["text"]["fp32"]


def test_the_report_gives_a_memory_bound_text_bag_its_flops_and_a_nonzero_mfu():
    """The TF-IDF bag, counted: the report shows its GFLOP (never 0) and an MFU with significant digits."""
    from trainlab.models.tfidf_bag import TfidfBag

    batch = text_batch()
    model = TfidfBag(V, C, L, buckets=16, char_buckets=16)
    model.fit_idf(batch["tokens"])
    flops = flops_per_step(text_trainable(model), batch)
    device = DeviceProfile("cuda", "test gpu", 2, "cuda_allocator", {"fp32": 5e13}, {}, torch.__version__)
    m = {"train_samples_per_s": 20000.0, "infer_samples_per_s": 90000.0, "train_step_ms": 0.2, "infer_step_ms": 0.05,
         "train_peak_memory_mb": 900, "infer_peak_memory_mb": 850, "train_spread": 0.05, "infer_spread": 0.1,
         "train_steps": 5, "infer_steps": 5, "train_warmup_s": 0.3, "train_warmup_steps": 3}
    measured = derived(m, flops, N, device.matmul_peak["fp32"], None)
    assert 0 < measured["train_mfu"] < 5e-4  # memory-bound: far below 0.05% of the matmul peak
    report = markdown_report(device, [ModelProfile("text", "tfidf_bag", 1000, flops, settings={"fp32": measured})],
                             N, 5, 3, 3, 1.0)
    assert f"{flops['train'] / 1e9:.3g} GFLOP per training step" in report and "0 GFLOP" not in report
    assert "floating-point multiplies and adds" in report and "MFU does not apply" not in report
    row = next(line for line in report.splitlines() if line.startswith("| `fp32`")).split(" | ")
    train_mfu, infer_mfu = row[5], row[6]  # after setting, samples/s (train, infer), step ms, GFLOP/s
    assert train_mfu == f"{100 * measured['train_mfu']:.2g}%" and float(train_mfu.rstrip("%")) > 0
    assert infer_mfu == f"{100 * measured['infer_mfu']:.2g}%" and float(infer_mfu.rstrip("%")) > 0
