"""The optimizer the engine builds: SGD fused where torch has the kernel, the steps of torch's plain SGD."""

from __future__ import annotations

import torch

from trainlab.core.config import TrainParams
from trainlab.engine.optim import build_optimizer, param_groups


def sgd_run(engine: bool) -> list[torch.Tensor]:
    """Ten steps of Nesterov SGD with weight decay on a small MLP: the engine's optimizer, or torch's plain one."""
    cfg = TrainParams(optimizer="sgd", lr=0.5, weight_decay=0.01, epochs=1, batch_size=16)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    groups = param_groups(model, cfg.weight_decay, cfg.lr)
    if engine:
        opt = build_optimizer(groups, cfg, torch.device("cpu"))
        assert all(group["fused"] for group in opt.param_groups)
    else:
        opt = torch.optim.SGD(groups, lr=cfg.lr, momentum=0.9, nesterov=True, foreach=False)
    start = [p.detach().clone() for p in model.parameters()]
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    for _ in range(10):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    assert max(float((p - s).abs().max()) for p, s in zip(model.parameters(), start)) > 0.01  # the steps moved them
    return [p.detach() for p in model.parameters()]


def test_sgd_is_fused_on_the_cpu_repeats_to_the_bit_and_takes_plain_sgds_steps_to_rounding():
    fused, again, plain = sgd_run(engine=True), sgd_run(engine=True), sgd_run(engine=False)
    for ours, repeat, theirs in zip(fused, again, plain):
        assert torch.equal(ours, repeat)
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
