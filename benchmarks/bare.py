"""The reference contenders: the training step a skilled user writes by hand, eager or captured whole in a CUDA graph.

Same model, batch transform (augmentation from one device generator), loss (label smoothing), clipping, fused AdamW
and per-step LR as the engine's recipe; nothing of the engine's own code (no TrainStep, no counters, no checks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

GRAPH_WARMUP_STEPS = 3


def bare_step(task, model, cfg, runtime, batch: dict, graph: bool, seed: int = 0,
              lr_at: Callable[[int], float] | None = None) -> Callable[[dict | None], None]:
    """A step function `step(batch=None)`: one optimizer update on `batch` (or on the last one given). With `graph`
    (CUDA only), the update is captured once on a side stream after a few warm-up updates and replayed, the
    batch copied into its static inputs; the LR (`lr_at(k)`, constant when None) lives in a device tensor."""
    if graph and runtime.device.type != "cuda":
        raise ValueError("a CUDA graph needs a CUDA device")
    update = BareUpdate.build(task, model, cfg, runtime, graph, seed)
    static = {k: v.clone() for k, v in batch.items()}
    set_lr = lr_setter(update.opt, cfg.lr, lr_at, graph)

    if not graph:
        def eager_step(data: dict | None = None) -> None:
            set_lr()
            update(static if data is None else data)
            update.opt.zero_grad(set_to_none=True)

        return eager_step

    cuda_graph = capture(update, static)

    def graph_step(data: dict | None = None) -> None:
        set_lr()
        if data is not None:
            for key, tensor in static.items():
                tensor.copy_(data[key])
        cuda_graph.replay()

    return graph_step


@dataclass(frozen=True)
class BareUpdate:
    """One optimizer update written by hand: the Trainable (batch transform, loss), model, recipe and runtime it
    follows, and what it builds from them: the trained parameters, AdamW, the augmentation generator, the autocast
    dtype."""

    task: Any
    model: Any
    cfg: Any
    runtime: Any
    params: list
    opt: Any
    gen: Any  # None without augmentation
    dtype: Any  # None: no autocast (fp32)

    @classmethod
    def build(cls, task, model, cfg, runtime, graph: bool, seed: int) -> BareUpdate:
        """AdamW with the engine's betas, fused on CUDA (capturable, with the LR in a device tensor, for a graph)."""
        import torch

        device = runtime.device
        cuda = device.type == "cuda"
        params = [p for p in model.parameters() if p.requires_grad]
        lr = torch.tensor(cfg.lr, device=device) if graph else cfg.lr
        opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay, fused=cuda,
                                capturable=graph, foreach=None if cuda else True)
        gen = torch.Generator(device).manual_seed(seed) if cfg.augments else None
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(runtime.precision)
        return cls(task, model, cfg, runtime, params, opt, gen, dtype)

    def __call__(self, data: dict) -> None:
        """Forward, backward, clipping and the optimizer step (the gradients are left for the caller to clear)."""
        import torch

        x, y = self.task.prepare_batch(data, True, self.gen)
        if self.task.conv and self.runtime.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(self.runtime.device.type, dtype=self.dtype, enabled=self.dtype is not None):
            loss = self.task.loss_fn(self.model(x), y)
        loss.backward()
        if self.cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip)
        self.opt.step()


def lr_setter(opt, lr: float, lr_at: Callable[[int], float] | None, graph: bool) -> Callable[[], None]:
    """Called before each update: update k's LR is `lr * lr_at(k)` (left alone when `lr_at` is None), written into
    the device tensor of a captured graph in place."""
    count = [0]

    def set_lr() -> None:
        if lr_at is not None:
            value = lr * lr_at(count[0])
            for group in opt.param_groups:
                if graph:
                    group["lr"].fill_(value)
                else:
                    group["lr"] = value
        count[0] += 1

    return set_lr


def capture(update: BareUpdate, static: dict):
    """The update captured as one CUDA graph on the `static` batch, after the textbook warm-up on a side stream (those
    updates are real ones); the augmentation generator's state is registered with the graph."""
    import torch

    device = update.runtime.device
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(GRAPH_WARMUP_STEPS):
            update(static)
            update.opt.zero_grad(set_to_none=True)
    torch.cuda.current_stream(device).wait_stream(side)
    cuda_graph = torch.cuda.CUDAGraph()
    if update.gen is not None:
        cuda_graph.register_generator_state(update.gen)
    with torch.cuda.graph(cuda_graph):
        update(static)
    return cuda_graph
