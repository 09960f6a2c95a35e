"""FLOPs of one training step (forward + backward) and one inference step, counted by torch's FlopCounterMode."""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from trainlab.engine.batches import Batch
from trainlab.engine.task import Task

aten = torch.ops.aten


def _cpu_sdpa_flop(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query, key, value)


def _cpu_sdpa_backward_flop(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


# torch's registry covers the CUDA attention kernels; the CPU flash kernel (used by SDPA with a mask and no
# dropout, e.g. at inference) is not in it and would count as zero.
EXTRA_FORMULAS = {
    aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flop,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_sdpa_backward_flop,
}


def count_flops(fn: Callable[[], object]) -> int:
    """Floating-point operations (multiply-add = 2) of the matmul/conv/attention ops that `fn` runs."""
    with FlopCounterMode(display=False, custom_mapping=EXTRA_FORMULAS) as counter:
        fn()
    return int(counter.get_total_flops())


def flops_per_step(task: Task, batch: Batch) -> dict[str, int]:
    """FLOPs of one train step (prepare + forward + loss + backward; the optimizer's elementwise update is not
    counted) and of one inference step, for `batch` on its device, counted in fp32 eager on a copy of the model."""
    device = next(iter(batch.values())).device
    model = copy.deepcopy(task.model).to(device).float()

    def train() -> None:
        model.train()
        x, y = task.prepare_batch(batch, True, None)
        task.loss_fn(model(x), y).backward()

    def infer() -> None:
        model.eval()
        with torch.no_grad():
            x, _ = task.prepare_batch(batch, False, None)
            model(x)

    return {"train": count_flops(train), "infer": count_flops(infer)}
