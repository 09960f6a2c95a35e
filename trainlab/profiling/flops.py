"""FLOPs of one training step (forward + backward) and one inference step, counted by torch's FlopCounterMode:
matmuls, convolutions and attention (torch's formulas), and embedding bags (formulas here); for a model with none of
those (it gathers table rows and sums them by hand), its floating-point multiplies and adds instead."""

from __future__ import annotations

import copy
import math
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


# An embedding bag sums (mode 0), averages (1) or takes the max (2) of the table rows its indices look up, each
# optionally scaled by a per-sample weight: a sparse matmul, which torch's registry does not know (it would count as
# zero). Every looked-up row costs one add per column (a comparison for max), and one multiply more with
# per_sample_weights; mean divides each bag once per column. The backward adds each row's gradient into the weight's
# gradient (scaled by the per-sample weight or 1 / bag size: one multiply more; max: each bag's maximum row only).
# Counted by the indices' shape, padding included, as attention counts its masked positions.
SUM, MEAN, MAX = 0, 1, 2


def _bag_flop(weight, indices, offsets, scale_grad_by_freq=False, mode=SUM, sparse=False, per_sample_weights=None,
              include_last_offset=False, padding_idx=-1, *, out_shape=None) -> int:
    rows, dim, bags = math.prod(indices), weight[-1], out_shape[0][0]
    return rows * dim * (2 if per_sample_weights is not None else 1) + (bags * dim if mode == MEAN else 0)


def _bag_gradient(grad, indices, mode: int, per_sample_weights) -> int:
    if mode == MAX:  # only each bag's maximum row gets its gradient
        return math.prod(grad)
    return math.prod(indices) * grad[-1] * (2 if per_sample_weights is not None or mode == MEAN else 1)


def _bag_backward_flop(grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
                       scale_grad_by_freq, mode, sparse, per_sample_weights, padding_idx=-1, *, out_shape=None) -> int:
    return _bag_gradient(grad, indices, mode, per_sample_weights)


def _bag_dense_backward_flop(grad, indices, offset2bag, bag_size, maximum_indices, num_weights, scale_grad_by_freq,
                             mode, per_sample_weights, padding_idx=-1, *, out_shape=None) -> int:
    return _bag_gradient(grad, indices, mode, per_sample_weights)


def _bag_sparse_backward_flop(grad, indices, offsets, offset2bag, bag_size, num_weights, scale_grad_by_freq, mode,
                              per_sample_weights, padding_idx=-1, *, out_shape=None) -> int:
    return _bag_gradient(grad, indices, mode, per_sample_weights)


def _bag_per_sample_weights_backward_flop(grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1, *,
                                          out_shape=None) -> int:
    return 2 * math.prod(indices) * grad[-1]  # a dot product of its bag's gradient and its row per index


# torch's registry covers the CUDA attention kernels; the CPU flash kernel (used by SDPA with a mask and no
# dropout, e.g. at inference) is not in it and would count as zero.
EXTRA_FORMULAS = {
    aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flop,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_sdpa_backward_flop,
    aten._embedding_bag: _bag_flop,
    aten._embedding_bag_forward_only: _bag_flop,
    aten._embedding_bag_backward: _bag_backward_flop,
    aten._embedding_bag_dense_backward: _bag_dense_backward_flop,
    aten._embedding_bag_sparse_backward: _bag_sparse_backward_flop,
    aten._embedding_bag_per_sample_weights_backward: _bag_per_sample_weights_backward_flop,
}


def _floating(out) -> bool:
    return isinstance(out, torch.Tensor) and out.is_floating_point()


def _elementwise_flop(*args, out_val=None, **kwargs) -> int:
    return out_val.numel() if _floating(out_val) else 0


def _sum_flop(x, *args, out_val=None, **kwargs) -> int:
    return x.numel() - out_val.numel() if _floating(out_val) else 0


def _index_add_flop(x, dim, index, source, *args, out_val=None, alpha=1, **kwargs) -> int:
    return source.numel() * (1 if alpha == 1 else 2) if _floating(out_val) else 0


for _formula in (_elementwise_flop, _sum_flop, _index_add_flop):
    _formula._get_raw = True  # FlopCounterMode passes these the tensors (for the dtype), not only their shapes
del _formula

# The floating-point multiplies and adds, one per output element (a sum: one per element summed away; index_add:
# one per source element), for a model whose step has no matmul, convolution, attention or embedding bag: the
# TF-IDF bag gathers its weight's rows with index_select, scales them by the features' weights and sums them (and
# its backward scales the gradient and index_adds it into the weight's). Integer arithmetic (hashing ids) is not
# counted.
ELEMENTWISE_FORMULAS = {
    **{op: _elementwise_flop for op in (aten.mul, aten.mul_, aten.add, aten.add_, aten.sub, aten.sub_, aten.div,
                                        aten.div_)},
    aten.sum: _sum_flop,
    aten.index_add: _index_add_flop,
    aten.index_add_: _index_add_flop,
}

MATMUL, ELEMENTWISE = "matmul", "elementwise"  # what a count is of (StepFlops.basis)


class StepFlops(dict):
    """{"train": FLOPs, "infer": FLOPs} of one step, and `basis`: MATMUL (matmuls, convolutions, attention and
    embedding bags) or ELEMENTWISE (a model with none of those: its floating-point multiplies and adds)."""

    def __init__(self, train: int, infer: int, basis: str = MATMUL):
        super().__init__(train=train, infer=infer)
        self.basis = basis


def count_flops(fn: Callable[[], object], elementwise: bool = False) -> int:
    """Floating-point operations (multiply-add = 2) of the matmul/conv/attention/embedding-bag ops that `fn` runs;
    `elementwise`: of its floating-point multiplies, adds and sums too."""
    formulas = {**EXTRA_FORMULAS, **ELEMENTWISE_FORMULAS} if elementwise else EXTRA_FORMULAS
    with FlopCounterMode(display=False, custom_mapping=formulas) as counter:
        fn()
    return int(counter.get_total_flops())


def flops_per_step(trainable: Trainable, batch: Batch) -> StepFlops:
    """FLOPs of one train step (prepare + forward + loss + backward; the optimizer's elementwise update is not
    counted) and of one inference step on `batch`, counted in fp32 eager on a copy of the model. A model in whose
    steps no matmul, convolution, attention or embedding bag is counted (the TF-IDF bag) is counted again by its
    floating-point multiplies and adds (basis ELEMENTWISE).

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

    def phase_flops(fn: Callable[[Batch], None], elementwise: bool) -> int:
        sizes = [n for n in (2, 3) if n <= batch_size] or [batch_size]
        counts = [count_flops(lambda n=n: fn({k: v[:n] for k, v in batch.items()}), elementwise) for n in sizes]
        if batch_size in sizes:
            return counts[sizes.index(batch_size)]
        return counts[0] + (counts[1] - counts[0]) * (batch_size - 2)

    threads = torch.get_num_threads()
    # The counter sends every op through Python; with several OpenMP threads each tiny op pays a fork/join
    # (seconds in all on a busy 2-core machine), with one thread it does not. The count is the same.
    torch.set_num_threads(1)
    try:
        out = StepFlops(phase_flops(train, False), phase_flops(infer, False))
        if not out["train"] and not out["infer"]:
            out = StepFlops(phase_flops(train, True), phase_flops(infer, True), ELEMENTWISE)
    finally:
        torch.set_num_threads(threads)
    return out
