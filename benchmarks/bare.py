"""The reference contenders: the training step a skilled user writes by hand, eager or captured whole in a CUDA graph.

Same model, batch transform (augmentation from one device generator), loss (label smoothing), clipping, fused AdamW
and per-step LR as the engine's recipe; nothing of the engine's own code (no TrainStep, no counters, no checks).
"""

from __future__ import annotations

from collections.abc import Callable

GRAPH_WARMUP_STEPS = 3


def bare_step(task, model, cfg, runtime, batch: dict, graph: bool, seed: int = 0,
              lr_at: Callable[[int], float] | None = None) -> Callable[[dict | None], None]:
    """A step function `step(batch=None)`: one optimizer update on `batch` (or on the last one given). With `graph`
    (CUDA only), the update is captured once on a side stream after a few warm-up updates and replayed, the
    batch copied into its static inputs; the LR (`lr_at(k)`, constant when None) lives in a device tensor."""
    import torch

    device = runtime.device
    cuda = device.type == "cuda"
    if graph and not cuda:
        raise ValueError("a CUDA graph needs a CUDA device")
    params = [p for p in model.parameters() if p.requires_grad]
    lr = torch.tensor(cfg.lr, device=device) if graph else cfg.lr
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay, fused=cuda,
                            capturable=graph, foreach=None if cuda else True)
    gen = torch.Generator(device).manual_seed(seed) if cfg.augment else None
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(runtime.precision)
    static = {k: v.clone() for k, v in batch.items()}
    count = [0]

    def update(data: dict) -> None:
        x, y = task.prepare_batch(data, True, gen)
        if task.conv and runtime.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = task.loss_fn(model(x), y)
        loss.backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()

    def set_lr() -> None:
        if lr_at is not None:
            value = cfg.lr * lr_at(count[0])
            for group in opt.param_groups:
                if graph:
                    group["lr"].fill_(value)
                else:
                    group["lr"] = value
        count[0] += 1

    if not graph:
        def eager_step(data: dict | None = None) -> None:
            set_lr()
            update(static if data is None else data)
            opt.zero_grad(set_to_none=True)

        return eager_step

    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):  # the textbook warm-up before a capture (these updates are real ones)
        for _ in range(GRAPH_WARMUP_STEPS):
            update(static)
            opt.zero_grad(set_to_none=True)
    torch.cuda.current_stream(device).wait_stream(side)
    cuda_graph = torch.cuda.CUDAGraph()
    if gen is not None:
        cuda_graph.register_generator_state(gen)
    with torch.cuda.graph(cuda_graph):
        update(static)

    def graph_step(data: dict | None = None) -> None:
        set_lr()
        if data is not None:
            for key, tensor in static.items():
                tensor.copy_(data[key])
        cuda_graph.replay()

    return graph_step
