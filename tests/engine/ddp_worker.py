"""Trains a tiny model with the engine (one process or under torchrun) and saves the final weights."""

import sys

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from trainlab.core import distributed
from trainlab.core.config import BaseParams, DistributedParams, TrainParams
from trainlab.core.repro import seed_everything
from trainlab.core.runtime import resolve_runtime
from trainlab.engine.contract import Trainable
from trainlab.engine.loop import fit


def main(out: str) -> None:
    runtime = resolve_runtime(BaseParams(device="cpu", precision="fp32"))
    ctx = distributed.setup(DistributedParams(backend="gloo"), "cpu")
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 255, (256, 1, 8, 8), generator=g, dtype=torch.uint8)
    y = (x.float().mean(dim=(1, 2, 3)) > 127).long()
    data = {"images": x, "labels": y}
    seed_everything(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 2))
    task = Trainable("ddp", model, lambda o, t: F.cross_entropy(o, t),
                lambda: MetricCollection({"accuracy": MulticlassAccuracy(2, average="micro")}),
                lambda b, train, gen: (b["images"].float() / 255, b["labels"]), "accuracy")
    cfg = TrainParams(epochs=2, batch_size=32, lr=1e-2, warmup_epochs=0.5, weight_decay=0.01, augment=False)
    result = fit(task, data, data, cfg, runtime, seed=0)
    if ctx.is_main:
        torch.save({k: v.clone() for k, v in result.model.state_dict().items()}, out)
        print(f"world_size={ctx.world_size} val_accuracy={result.history[-1]['val_accuracy']:.4f}")
    distributed.teardown()


if __name__ == "__main__":
    main(sys.argv[1])
