"""A checkpoint resumed on another device: optimizer state and RNG states land where each is used (the mapping logic,
on the CPU; tests/test_gpu.py resumes a CPU checkpoint on CUDA)."""

from __future__ import annotations

import torch

from tests.engine.test_loop import CFG, make_trainable, tiny_data
from trainlab.core.config import BaseParams
from trainlab.core.runtime import resolve_runtime
from trainlab.engine.step import TrainStep, load_optimizer_state, restore_generator


def cpu_step_state(steps: int = 3) -> tuple[dict, torch.nn.Module]:
    """A CPU TrainStep's state after `steps` updates (foreach AdamW: its step counts on the CPU), and its model."""
    task = make_trainable()
    step = TrainStep(task, task.model, CFG, resolve_runtime(BaseParams(device="cpu", precision="fp32")),
                     total_updates=10, seed=0)
    batch = tiny_data(16)
    for _ in range(steps):
        step(batch)
    return step.state_dict(), task.model


def test_a_cpu_checkpoint_loaded_by_a_fused_capturable_optimizer_on_another_device_has_its_state_there():
    """'meta' stands in for CUDA: torch's own load leaves the step counts on the CPU (it follows the saved groups'
    flags: not fused, not capturable); load_optimizer_state keeps this optimizer's flags and moves them to the
    parameters' device, as its kernels need."""
    state, model = cpu_step_state()
    saved = state["optimizer"]
    assert not any(g.get("fused") or g.get("capturable") for g in saved["param_groups"])
    params = [torch.nn.Parameter(p.detach().to("meta")) for p in model.parameters()]
    groups = [{"params": [params[i] for i in g["params"]], "weight_decay": g["weight_decay"]}
              for g in saved["param_groups"]]
    for kw in ({"fused": True, "capturable": True}, {"fused": True}, {"capturable": True}):
        plain = torch.optim.AdamW(groups, lr=1e-3, **kw)
        plain.load_state_dict(saved)  # torch alone: the bug this guards against
        assert all(s["step"].device.type == "cpu" for s in plain.state.values())
        optimizer = torch.optim.AdamW(groups, lr=1e-3, **kw)
        load_optimizer_state(optimizer, saved)
        assert all(g.get(k) == v for g in optimizer.param_groups for k, v in kw.items())
        assert optimizer.state and all(
            {k: v.device.type for k, v in s.items()} == {"step": "meta", "exp_avg": "meta", "exp_avg_sq": "meta"}
            for s in optimizer.state.values())


def test_a_generator_state_of_another_device_reseeds_deterministically():
    cpu_state = torch.Generator().manual_seed(5).get_state()
    g = torch.Generator()
    assert restore_generator(g, cpu_state, seed=1, updates=7)
    assert torch.equal(g.get_state(), cpu_state)
    philox = torch.zeros(16, dtype=torch.uint8)  # what a CUDA generator's get_state() returns: seed and offset
    draws = []
    for _ in range(2):
        g = torch.Generator()
        assert not restore_generator(g, philox, seed=1, updates=7)
        draws.append(torch.rand(4, generator=g))
    assert torch.equal(*draws)
    g = torch.Generator()
    restore_generator(g, philox, seed=1, updates=8)
    assert not torch.equal(torch.rand(4, generator=g), draws[0])


def test_a_step_resumed_from_its_own_checkpoint_is_unchanged_by_the_placement():
    state, _ = cpu_step_state()
    task = make_trainable()
    step = TrainStep(task, task.model, CFG, resolve_runtime(BaseParams(device="cpu", precision="fp32")),
                     total_updates=10, seed=0)
    step.load_state_dict(state)
    assert step.updates == 3
    assert torch.equal(step.augment.get_state(), state["augment"])
    for s in step.optimizer.state.values():  # foreach AdamW on the CPU: everything there, the step a float32
        assert all(v.device.type == "cpu" for v in s.values()) and s["step"].dtype == torch.float32
