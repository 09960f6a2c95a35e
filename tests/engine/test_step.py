"""The training step on its own: when it may be a CUDA graph, the LR schedule on host and device, EMA, no state."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.engine.test_loop import CFG, make_trainable, runtime, tiny_data
from trainlab.engine.ema import EMA
from trainlab.engine.optim import LRSchedule, warmup_cosine, warmup_cosine_on_device
from trainlab.engine.step import TrainStep, graphs_plan


def test_graphs_are_off_on_a_cpu_silently_for_auto_and_with_a_reason_when_asked_for():
    rt = runtime(precision="fp32")
    assert graphs_plan("auto", rt, CFG) == (False, None)
    assert graphs_plan(False, rt, CFG) == (False, None)
    on, why = graphs_plan(True, rt, CFG)
    assert not on and "not a CUDA device" in why


@pytest.mark.parametrize("change, reason", [
    ({"accumulation_steps": 2}, "accumulation_steps"),
    ({"activation_checkpointing": True}, "activation checkpointing"),
])
def test_settings_that_cannot_be_captured_say_why(change, reason):
    cuda = dataclasses.replace(runtime(precision="bf16"), device=torch.device("cuda"))  # only read, never used
    assert graphs_plan("auto", cuda, CFG) == (True, None)
    on, why = graphs_plan("auto", cuda, CFG.model_copy(update=change))
    assert not on and reason in why
    assert graphs_plan("auto", cuda, CFG, distributed=True)[1].startswith("DDP")
    assert "GradScaler" in graphs_plan("auto", dataclasses.replace(cuda, precision="fp16"), CFG)[1]
    assert "torch.compile" in graphs_plan(True, dataclasses.replace(cuda, compile=True), CFG)[1]


@pytest.mark.parametrize("schedule, warmup", [("cosine", 0), ("cosine", 7), ("constant", 5)])
def test_the_device_schedule_matches_the_host_schedule(schedule, warmup):
    host = warmup_cosine(50, warmup, schedule)
    steps = torch.arange(0, 60)
    device = warmup_cosine_on_device(steps, 50, warmup, schedule)
    torch.testing.assert_close(device, torch.tensor([host(int(s)) for s in steps], dtype=torch.float64))


def test_tensor_learning_rates_are_written_in_place_by_the_schedule():
    """Capturable AdamW keeps each group's LR as a tensor that a CUDA graph reads: the schedule must write into that
    tensor, never replace it (the graph would keep reading the old one)."""
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW([{"params": model.parameters(), "lr": torch.tensor(0.1)}], lr=torch.tensor(0.1))
    lr = opt.param_groups[0]["lr"]
    schedule = LRSchedule(opt, total_steps=10, warmup_steps=2, schedule="cosine")
    assert schedule.on_device
    schedule.set(torch.tensor(0))
    assert opt.param_groups[0]["lr"] is lr and float(lr) == pytest.approx(0.05)
    schedule.set(5)
    assert opt.param_groups[0]["lr"] is lr and float(lr) == pytest.approx(schedule.lr_at(5))


def assert_capturable_optimizer_takes_the_eager_steps(optimizer: str, device: torch.device) -> None:
    """The optimizer a CUDA graph replays (fused, LRs as tensors set by the device schedule) against the eager one
    with host LRs, over warm-up and cosine decay: the same weights to rounding."""
    from trainlab.engine.optim import build_optimizer, param_groups

    cfg = CFG.model_copy(update={"optimizer": optimizer, "lr": 0.5 if optimizer == "sgd" else 0.01,
                                 "weight_decay": 0.01})
    torch.manual_seed(0)
    models = [torch.nn.Linear(4, 3).to(device) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    start = models[0].weight.detach().clone()
    x, y = torch.randn(16, 4, device=device), torch.randint(0, 3, (16,), device=device)
    runs = []
    for model, capturable in zip(models, (False, True)):
        opt = build_optimizer(param_groups(model, cfg.weight_decay, cfg.lr), cfg, device, capturable=capturable)
        schedule = LRSchedule(opt, total_steps=12, warmup_steps=3, schedule="cosine")
        assert schedule.on_device == capturable
        for step in range(12):
            schedule.set(torch.tensor(step, device=device) if capturable else step)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        runs.append(model.weight.detach())
    assert (runs[0] - start).abs().max() > 0.01  # the steps moved the weights
    torch.testing.assert_close(runs[1], runs[0], rtol=1e-5, atol=1e-6)


def test_capturable_sgd_takes_the_same_steps_as_the_eager_one():
    """Fused SGD runs on the CPU too (capturable AdamW only on CUDA: tests/test_gpu.py checks both there)."""
    assert_capturable_optimizer_takes_the_eager_steps("sgd", torch.device("cpu"))


class HostReads(TorchDispatchMode):
    """Counts the reads of a tensor's value by the host (`.item()`, a tensor used as a Python number): on CUDA each
    one waits for the device."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func is torch.ops.aten._local_scalar_dense.default
        return func(*args, **(kwargs or {}))


def test_ema_warms_its_decay_up_then_follows_the_model_by_it_and_copies_integer_buffers():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    ema = EMA(model, decay=0.75)
    start = model[0].weight.detach().clone()
    with torch.no_grad():
        model[0].weight.add_(4.0)
        model[1].num_batches_tracked.fill_(7)
    with HostReads() as reads:  # the first step's decay is min(0.75, 1 / 10): 90% of the way to the model
        ema.update(torch.tensor(0))
    assert reads.count == 0, "the EMA update read a tensor's value on the host (a sync on CUDA)"
    torch.testing.assert_close(ema.module[0].weight, start + 3.6)
    ema.update(torch.tensor(100))  # past the warm-up the decay is 0.75: a quarter of the remaining 0.4
    torch.testing.assert_close(ema.module[0].weight, start + 3.7)
    assert int(ema.module[1].num_batches_tracked) == 7
    assert not any(p.requires_grad for p in ema.module.parameters())


def test_the_step_accumulates_loss_on_the_device_and_updates_once_per_accumulation():
    task = make_trainable()
    cfg = CFG.model_copy(update={"accumulation_steps": 2})
    step = TrainStep(task, task.model, cfg, runtime(precision="fp32"), total_updates=4, seed=0)
    data = tiny_data(32)
    before = task.model[0].weight.detach().clone()
    batches = [{k: v[i * 8:(i + 1) * 8] for k, v in data.items()} for i in range(4)]
    done = [step(b) for b in batches]
    assert done == [False, True, False, True] and step.updates == 2 and int(step.update_count) == 2
    assert int(step.seen) == 32 and float(step.loss_sum) > 0
    assert not torch.equal(before, task.model[0].weight)


def test_step_state_round_trips_through_a_checkpoint_dict():
    task = make_trainable()
    cfg = CFG.model_copy(update={"ema_decay": 0.9})
    a = TrainStep(task, task.model, cfg, runtime(precision="fp32"), total_updates=10, seed=1)
    data = tiny_data(16)
    a(data)
    state = a.state_dict()
    other = make_trainable(seed=1)
    b = TrainStep(other, other.model, cfg, runtime(precision="fp32"), total_updates=10, seed=1)
    b.load_state_dict(state)
    assert b.updates == 1 and int(b.update_count) == 1 and int(b.seen) == 16
    assert torch.equal(a.augment.get_state(), b.augment.get_state())
    assert all(torch.equal(x, y) for x, y in zip(a.ema.state_dict().values(), b.ema.state_dict().values()))


@pytest.mark.parametrize("steps_before", [0, 2])  # a fresh optimizer, and one with state (a resumed run)
def test_warm_up_updates_are_undone_exactly(steps_before):
    """What a CUDA capture runs first must leave no trace: the next update gives the same bits as without it."""
    cfg = CFG.model_copy(update={"ema_decay": 0.9})
    data = tiny_data(16)
    results = []
    for warm in (False, True):
        torch.manual_seed(0)
        task = make_trainable()
        step = TrainStep(task, task.model, cfg, runtime(precision="fp32"), total_updates=10, warmup_updates=2,
                         seed=4)
        for _ in range(steps_before):
            step(data)
        if warm:
            step.warm_up_and_undo(data, 3)
            assert step.updates == steps_before and int(step.update_count) == steps_before
        step(data)
        results.append([t.detach().clone() for t in step._mutable_tensors()] + [torch.rand(2)])
    assert len(results[0]) == len(results[1])
    for a, b in zip(*results):
        assert torch.equal(a, b)


@pytest.mark.parametrize("grad_clip, scale, multiplies",
                         [(1e6, 1.0, False), (1e-3, 1.0, True), (1.0, float("nan"), True)])
def test_clipping_on_a_cpu_gives_clip_grad_norms_bits_and_multiplies_only_when_it_changes_them(
        grad_clip, scale, multiplies, monkeypatch):
    task = make_trainable()
    cfg = CFG.model_copy(update={"grad_clip": grad_clip})
    step = TrainStep(task, task.model, cfg, runtime(precision="fp32"), total_updates=4, seed=0)
    x, y = task.prepare_batch(tiny_data(16), True, None)
    (task.loss_fn(task.model(x), y) * scale).backward()
    reference = [torch.nn.Parameter(p.detach().clone()) for p in step.params]
    for ref, p in zip(reference, step.params):
        ref.grad = p.grad.clone()
    torch.nn.utils.clip_grad_norm_(reference, grad_clip)
    calls = []
    real = torch.nn.utils.clip_grads_with_norm_
    monkeypatch.setattr(torch.nn.utils, "clip_grads_with_norm_", lambda *a, **k: calls.append(1) or real(*a, **k))
    step._clip()
    assert bool(calls) == multiplies
    for p, ref in zip(step.params, reference):
        assert torch.equal(p.grad, ref.grad) or (p.grad.isnan().all() and ref.grad.isnan().all())
