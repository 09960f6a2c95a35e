"""Precise BatchNorm statistics: exact averages over the given batches, no dropout or RNG drawn, and when auto
turns them on."""

import torch
from torch import nn

from trainlab.core.config import BaseParams
from trainlab.core.runtime import resolve_runtime
from trainlab.engine.precise_bn import PRECISE_BN_BELOW_STEPS, recompute_batchnorm, wanted


def model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(2, 3, 1), nn.BatchNorm2d(3), nn.Dropout(0.5), nn.Flatten(), nn.Linear(3 * 16, 2))


def test_running_statistics_become_the_exact_average_of_the_batches():
    net = model().train()
    batches = [torch.randn(8, 2, 4, 4) * (i + 1) + i for i in range(3)]
    rng = torch.get_rng_state()
    recompute_batchnorm(net, batches, resolve_runtime(BaseParams(device="cpu", precision="fp32")))
    assert torch.equal(torch.get_rng_state(), rng)  # dropout stayed off: no random numbers drawn
    assert net.training and net[1].momentum == 0.1  # the model's mode and BatchNorm's momentum are put back
    features = [net[0](x).detach() for x in batches]
    mean = torch.stack([f.mean(dim=(0, 2, 3)) for f in features]).mean(0)
    var = torch.stack([f.transpose(0, 1).reshape(3, -1).var(dim=1) for f in features]).mean(0)
    assert torch.allclose(net[1].running_mean, mean, atol=1e-5) and torch.allclose(net[1].running_var, var, atol=1e-4)


def test_auto_recomputes_only_short_epochs_of_batchnorm_models_outside_ddp():
    short, long = PRECISE_BN_BELOW_STEPS - 1, PRECISE_BN_BELOW_STEPS
    assert wanted("auto", model(), short, distributed=False)
    assert not wanted("auto", model(), long, distributed=False)
    assert not wanted("auto", nn.Linear(2, 2), short, distributed=False)  # no BatchNorm: nothing to recompute
    assert not wanted(True, model(), short, distributed=True)
    assert wanted(True, model(), long, distributed=False) and not wanted(False, model(), short, distributed=False)
