"""Loss and metrics of a model over a split (validation during fit, the test after it), reduced over DDP ranks."""

from __future__ import annotations

import torch
from torch import nn

from trainlab.core import distributed
from trainlab.core.runtime import Runtime
from trainlab.engine.batches import Batch, eval_batch_size, make_batches
from trainlab.engine.contract import Trainable
from trainlab.engine.metrics import bincount_allowed
from trainlab.engine.step import to_device_layout


def scalars(metrics: dict[str, torch.Tensor]) -> dict[str, float]:
    """The scalar entries of a metrics dict as floats (one sync for all of them)."""
    keys = [k for k, v in metrics.items() if not torch.is_tensor(v) or v.numel() == 1]
    values = torch.stack([torch.as_tensor(metrics[k], dtype=torch.float32).reshape(()).cpu() for k in keys]) \
        if keys else torch.empty(0)
    return {k: float(v) for k, v in zip(keys, values.tolist())}


@torch.inference_mode()
def evaluate(trainable: Trainable, model: nn.Module, data: Batch, runtime: Runtime, batch_size: int = 256,
             max_device_mb: int = 2048) -> dict[str, torch.Tensor]:
    """Loss and the trainable's metrics over `data` (no gradients, eval mode, same precision as training).
    Under torch.distributed each rank takes its own slice and the results are reduced over all ranks."""
    model.eval()
    ctx = distributed.context()
    if ctx.enabled:
        data = {k: v[ctx.rank :: ctx.world_size] for k, v in data.items()}
    batches = make_batches(data, eval_batch_size(data, batch_size), runtime.device, seed=0, shuffle=False,
                           drop_last=False, max_device_mb=max_device_mb)
    metrics = trainable.make_metrics().to(runtime.device)
    loss_sum = torch.zeros((), device=runtime.device)
    count = 0
    for batch in batches.epoch(0):
        x, y = trainable.prepare_batch(batch, False, None)
        x = to_device_layout(x, trainable, runtime)
        with runtime.autocast():
            out = model(x)
            loss = trainable.loss_fn(out, y)
        n = y.shape[0]
        loss_sum += loss.float() * n
        count += n
        with bincount_allowed(runtime.device):
            metrics.update(trainable.predict(out.float()), y)
    totals = distributed.all_reduce_sum(torch.stack([loss_sum, torch.tensor(float(count), device=loss_sum.device)]))
    return {"loss": totals[0] / totals[1].clamp(min=1), **metrics.compute()}
