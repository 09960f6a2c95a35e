"""CUDA checks (`pytest -m gpu`, on a machine with an NVIDIA GPU): the engine, the three tasks and determinism on
the device. Skipped where no CUDA device is present; everything here also runs on CPU in the other tests."""

from __future__ import annotations

import pytest
import torch

from tests.engine.test_loop import CFG, assert_bitwise_equal, make_trainable, stop_after_updates, tiny_data, weights
from trainlab.core.config import BaseParams, SegmenterParams, TextParams
from trainlab.core.repro import seed_everything
from trainlab.core.runtime import resolve_runtime
from trainlab.engine.loop import FitHooks, FitOptions, evaluate, fit, scalars
from trainlab.models.segmenter import build_segmenter
from trainlab.models.text import build_text_model
from trainlab.tasks.segmenter import segmentation_trainable

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on a GPU machine)")]


def cuda_runtime(**kw):
    return resolve_runtime(BaseParams(device="cuda", **kw))


def canvases(n: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Bright squares on a dark 16x16 canvas; the mask marks them with class 1 or 2 (by brightness)."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 40, (n, 1, 16, 16), generator=g, dtype=torch.uint8)
    masks = torch.zeros(n, 16, 16, dtype=torch.uint8)
    for i in range(n):
        r, c = torch.randint(0, 10, (2,), generator=g).tolist()
        cls = 1 + i % 2
        images[i, 0, r:r + 6, c:c + 6] = 140 if cls == 1 else 250
        masks[i, r:r + 6, c:c + 6] = cls
    return {"images": images, "masks": masks}


def test_auto_precision_is_bf16_on_a_bf16_gpu_and_the_model_lives_there():
    rt = cuda_runtime()
    assert rt.device.type == "cuda"
    assert rt.precision == ("bf16" if torch.cuda.is_bf16_supported() else "fp16")
    result = fit(make_trainable(), tiny_data(256), tiny_data(64, 1), CFG, rt, seed=0)
    assert next(result.model.parameters()).device.type == "cuda"
    losses = [r["train_loss"] for r in result.history]
    assert losses[-1] < losses[0] * 0.7


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp32"])
def test_same_seed_gives_bitwise_equal_weights_on_cuda(precision):
    rt = cuda_runtime(precision=precision, deterministic=True)
    runs = []
    for _ in range(2):
        seed_everything(11)
        runs.append(weights(fit(make_trainable(), tiny_data(128), tiny_data(32, 1), CFG, rt, seed=11).model))
    assert_bitwise_equal(*runs)


def test_stop_and_resume_on_cuda_is_bitwise_equal(tmp_path):
    from trainlab.engine.loop import TrainingInterrupted

    rt = cuda_runtime(deterministic=True)
    cfg = CFG.model_copy(update={"ema_decay": 0.9})
    train, val = tiny_data(160), tiny_data(32, 1)
    seed_everything(3)
    reference = fit(make_trainable(), train, val, cfg, rt, seed=3)
    ckpt = tmp_path / "last.pt"
    with pytest.raises(TrainingInterrupted):
        fit(make_trainable(), train, val, cfg, rt, seed=3,
            options=FitOptions(checkpoint_path=ckpt, fingerprint="a"),
            hooks=FitHooks(stop_after=stop_after_updates(7)))
    resumed = fit(make_trainable(seed=5), train, val, cfg, rt, seed=3,
                  options=FitOptions(checkpoint_path=ckpt, fingerprint="a"))
    assert resumed.resumed_from_step == 7
    assert_bitwise_equal(weights(reference.model), weights(resumed.model))


def test_segmentation_loss_and_metrics_run_under_deterministic_algorithms_on_cuda():
    """CE with reduction='none' + soft Dice: no op without a deterministic CUDA kernel; two runs are equal."""
    rt = cuda_runtime(deterministic=True)
    assert torch.are_deterministic_algorithms_enabled()
    cfg = SegmenterParams(base_channels=8, depth=2, epochs=2, batch_size=8, lr=3e-3, warmup_epochs=0)
    runs = []
    for _ in range(2):
        seed_everything(2)
        task = segmentation_trainable(build_segmenter(cfg, num_classes=3, in_channels=1), 3)
        result = fit(task, canvases(64), canvases(16, 1), cfg, rt, seed=2)
        runs.append(weights(result.model))
    assert_bitwise_equal(*runs)
    test = scalars(evaluate(task, result.model, canvases(16, 2), rt, 8))
    assert 0.0 <= test["mean_iou"] <= 1.0 and test["pixel_accuracy"] > 0.5


def test_text_model_bf16_autocast_on_cuda_matches_fp32():
    model = build_text_model(TextParams(arch="transformer", d_model=32, n_heads=4, n_layers=2, dim_feedforward=64,
                                        dropout=0.0), 100, num_classes=3, max_length=16).cuda().eval()
    tokens = torch.randint(3, 100, (8, 16), device="cuda")
    tokens[4:, 10:] = 0  # padding
    with torch.no_grad():
        exact = model(tokens)
        with torch.autocast("cuda", torch.bfloat16):
            fast = model(tokens)
    torch.testing.assert_close(fast.float(), exact, atol=0.05, rtol=0.05)


def _why_no_compile() -> str | None:
    from benchmarks.gpu_preflight import compiler

    return compiler()[1]


@pytest.mark.skipif(_why_no_compile() is not None, reason=f"torch.compile cannot build here: {_why_no_compile()}")
def test_compiled_classifier_step_on_cuda_matches_eager():
    rt = cuda_runtime(precision="fp32", compile=True)
    cfg = CFG.model_copy(update={"epochs": 1})
    seed_everything(4)
    compiled = fit(make_trainable(dropout=0.0), tiny_data(64), tiny_data(16, 1), cfg, rt, seed=4)
    seed_everything(4)
    eager = fit(make_trainable(dropout=0.0), tiny_data(64), tiny_data(16, 1), cfg,
                cuda_runtime(precision="fp32"), seed=4)
    first = [r["train_loss"] for r in compiled.history]
    assert first == pytest.approx([r["train_loss"] for r in eager.history], rel=1e-3)


def graphed_fit(cfg, seed, hooks=FitHooks(), **options):
    seed_everything(seed)
    return fit(make_trainable(), tiny_data(160), tiny_data(32, 1), cfg, cuda_runtime(deterministic=True), seed=seed,
               options=FitOptions(cuda_graphs=True, **options), hooks=hooks)


def test_graphed_training_learns_and_is_bitwise_reproducible():
    cfg = CFG.model_copy(update={"ema_decay": 0.9})
    first, second = graphed_fit(cfg, 21), graphed_fit(cfg, 21)
    assert first.cuda_graphs and second.cuda_graphs
    losses = [r["train_loss"] for r in first.history]
    assert losses[-1] < losses[0] * 0.7
    assert_bitwise_equal(weights(first.model), weights(second.model))


@pytest.mark.parametrize("stop_at", [4, 10])  # mid-epoch, at an epoch boundary
def test_graphed_stop_and_resume_is_bitwise_equal(tmp_path, stop_at):
    from trainlab.engine.loop import TrainingInterrupted

    cfg = CFG.model_copy(update={"ema_decay": 0.9})
    reference = graphed_fit(cfg, 5)
    ckpt = tmp_path / "last.pt"
    with pytest.raises(TrainingInterrupted):
        graphed_fit(cfg, 5, FitHooks(stop_after=stop_after_updates(stop_at)), checkpoint_path=ckpt, fingerprint="a")
    seed_everything(99)
    resumed = fit(make_trainable(seed=7), tiny_data(160), tiny_data(32, 1), cfg,
                  cuda_runtime(deterministic=True), seed=5,
                  options=FitOptions(cuda_graphs=True, checkpoint_path=ckpt, fingerprint="a"))
    assert resumed.resumed_from_step == stop_at and resumed.cuda_graphs
    assert_bitwise_equal(weights(reference.model), weights(resumed.model))


def test_graphed_and_eager_training_agree_closely():
    cfg = CFG.model_copy(update={"epochs": 2})
    graphed = graphed_fit(cfg, 8)
    seed_everything(8)
    eager = fit(make_trainable(), tiny_data(160), tiny_data(32, 1), cfg, cuda_runtime(deterministic=True), seed=8,
                options=FitOptions(cuda_graphs=False))
    assert not eager.cuda_graphs
    assert [r["train_loss"] for r in graphed.history] == pytest.approx(
        [r["train_loss"] for r in eager.history], rel=0.05)


@pytest.mark.parametrize("graphs", [True, False], ids=["graphed", "eager"])  # -k groups of scripts/gpu-check
def test_a_cpu_checkpoint_resumes_on_cuda_with_its_state_there(tmp_path, graphs):
    """Stopped on the CPU (foreach AdamW, a CPU augmentation generator), resumed on CUDA (fused or capturable AdamW,
    a CUDA generator): every optimizer state tensor on the GPU, the augmentation reseeded, training finishes."""
    from trainlab.engine.loop import TrainingInterrupted
    from trainlab.engine.step import TrainStep

    cfg = CFG.model_copy(update={"ema_decay": 0.9})
    train, val = tiny_data(160), tiny_data(32, 1)
    ckpt = tmp_path / "last.pt"
    with pytest.raises(TrainingInterrupted):
        fit(make_trainable(), train, val, cfg, resolve_runtime(BaseParams(device="cpu", precision="fp32")), seed=3,
            options=FitOptions(checkpoint_path=ckpt, fingerprint="a"),
            hooks=FitHooks(stop_after=stop_after_updates(4)))
    resumed = fit(make_trainable(), train, val, cfg, cuda_runtime(), seed=3,
                  options=FitOptions(checkpoint_path=ckpt, fingerprint="a", cuda_graphs=graphs))
    assert resumed.resumed_from_step == 4 and resumed.cuda_graphs == graphs
    assert all(torch.isfinite(torch.tensor(r["train_loss"])) for r in resumed.history)
    state = torch.load(ckpt, weights_only=True)["step"] if ckpt.exists() else None
    task = make_trainable()
    step = TrainStep(task, task.model.cuda(), cfg, cuda_runtime(), total_updates=30, seed=3, graphs=graphs)
    if state is None:  # fit removes its checkpoint when it finishes: take one from a fresh CPU run
        cpu_trainable = make_trainable()
        cpu = TrainStep(cpu_trainable, cpu_trainable.model,
                        cfg, resolve_runtime(BaseParams(device="cpu", precision="fp32")),
                        total_updates=30, seed=3)
        for _ in range(3):
            cpu(tiny_data(16))
        state = cpu.state_dict()
    step.load_state_dict(state)
    for s in step.optimizer.state.values():
        assert {v.device.type for v in s.values()} == {"cuda"}, {k: v.device for k, v in s.items()}
    batch = {k: v.cuda() for k, v in tiny_data(16).items()}
    for _ in range(3):
        step(batch)
    assert torch.isfinite(step.loss_sum)


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_capturable_optimizers_take_the_same_steps_as_the_eager_ones_on_cuda(optimizer):
    from tests.engine.test_step import assert_capturable_optimizer_takes_the_eager_steps

    assert_capturable_optimizer_takes_the_eager_steps(optimizer, torch.device("cuda"))


def _task_and_batch(name: str):
    """Each of the three real tasks with a batch on the GPU (the default recipes: augmentation, clipping)."""
    from trainlab.core.config import Params
    from trainlab.jobs.train import build_trainable

    if name == "classifier":
        meta, n = {"num_classes": 10, "channels": 1}, 32
        batch = {"images": torch.randint(0, 255, (n, 1, 28, 28), dtype=torch.uint8),
                 "labels": torch.randint(0, 10, (n,))}
    elif name == "segmenter":
        meta, n = {"num_classes": 3, "channels": 1}, 8
        batch = canvases(n)
    else:
        meta, n = {"num_classes": 3, "vocab_size": 200, "max_length": 24}, 32
        batch = {"tokens": torch.randint(1, 200, (n, 24)), "labels": torch.randint(0, 3, (n,))}
        batch["tokens"][::2, 12:] = 0
    seed_everything(0)
    if name.startswith("text_tfidf_bag"):  # params.yaml's text default (auto: a head per candidate weight decay)
        decay = "auto" if name.endswith("auto") else 2e-5  # with its statistics fitted as training fits them
        params = Params(text=TextParams(arch="tfidf_bag", optimizer="sgd", lr=3.0, weight_decay=decay))
        task = build_trainable("text", params, meta)
        task.model.fit_vocabulary(["[PAD]", "[UNK]", "[CLS]", *(f"word{i}" for i in range(197))])
        task.model.fit_idf(batch["tokens"])
        return task, params.text, {k: v.cuda() for k, v in batch.items()}
    # "text": the Transformer with the recipe params.yaml's text.arch comment gives it (its dropout too); the
    # default TF-IDF bag is the cases above
    transformer = TextParams(arch="transformer", optimizer="adamw", lr=0.001, weight_decay=0.01, dropout=0.1)
    params = Params(text=transformer) if name == "text" else Params()
    return build_trainable(name, params, meta), getattr(params, name), {k: v.cuda() for k, v in batch.items()}


@pytest.mark.parametrize("name", ["classifier", "segmenter", "text", "text_tfidf_bag", "text_tfidf_bag_auto"])
@pytest.mark.parametrize("graphs", [True, False])
def test_the_training_step_never_synchronises_with_the_host(name, graphs):
    from trainlab.engine.step import TrainStep

    task, cfg, batch = _task_and_batch(name)
    cfg = cfg.model_copy(update={"ema_decay": 0.99})  # the EMA update too (a superset of the default recipe)
    rt = cuda_runtime(precision="bf16")
    model = task.model.cuda()
    if task.conv:
        model = model.to(memory_format=torch.channels_last)
    step = TrainStep(task, model, cfg, rt, total_updates=100, warmup_updates=3, seed=0, graphs=graphs)
    step(batch)  # the first call may set things up (lazy optimizer state, the capture)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(5):
            step(batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert step.updates == 6 and int(step.update_count) == 6
    assert torch.isfinite(step.loss_sum) and int(step.seen) == 6 * len(next(iter(batch.values())))
