"""FLOPs of one training step (forward + backward) and one inference step, counted by torch's FlopCounterMode."""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from trainlab.engine.batches import Batch
from trainlab.engine.contract import Trainable

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


def flops_per_step(trainable: Trainable, batch: Batch) -> dict[str, int]:
    """FLOPs of one train step (prepare + forward + loss + backward; the optimizer's elementwise update is not
    counted) and of one inference step on `batch`, counted in fp32 eager on a copy of the model.

    Counted on 2 and 3 samples and extrapolated linearly to the batch (FLOPs are affine in the batch size for
    these layers), so the count costs tiny steps, not a full-batch step; not on 1 sample, whose 1x1 feature maps
    (small images through a pooled network) leave a training BatchNorm one value per channel, an error.
    """
    device = next(iter(batch.values())).device
    model = copy.deepcopy(trainable.model).to(device).float()
    batch_size = len(next(iter(batch.values())))

    def train(sub: Batch) -> None:
        model.train()
        x, y = trainable.prepare_batch(sub, True, None)
        trainable.loss_fn(model(x), y).backward()
        model.zero_grad(set_to_none=True)

    def infer(sub: Batch) -> None:
        model.eval()
        with torch.no_grad():
            x, _ = trainable.prepare_batch(sub, False, None)
            model(x)

    out = {}
    threads = torch.get_num_threads()
    # The counter sends every op through Python; with several OpenMP threads each tiny op pays a fork/join
    # (seconds in all on a busy 2-core machine), with one thread it does not. The count is the same.
    torch.set_num_threads(1)
    try:
        for phase, fn in (("train", train), ("infer", infer)):
            sizes = [n for n in (2, 3) if n <= batch_size] or [batch_size]
            counts = [count_flops(lambda n=n, fn=fn: fn({k: v[:n] for k, v in batch.items()})) for n in sizes]
            if batch_size in sizes:
                out[phase] = counts[sizes.index(batch_size)]
            else:
                out[phase] = counts[0] + (counts[1] - counts[0]) * (batch_size - 2)
    finally:
        torch.set_num_threads(threads)
    return out
