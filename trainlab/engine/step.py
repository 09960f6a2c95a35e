"""The engine's training step, shared by fit, the profile stage and the benchmarks: forward, loss, backward,
clipping, optimizer, LR schedule and EMA, run eagerly or replayed as one CUDA graph."""

from __future__ import annotations

import torch
from torch import nn

from trainlab.core import auto
from trainlab.core.config import TrainParams
from trainlab.core.repro import derived_seed, generator
from trainlab.core.runtime import Runtime
from trainlab.engine.batches import Batch
from trainlab.engine.contract import Trainable
from trainlab.engine.ema import EMA
from trainlab.engine.optim import LRSchedule, build_optimizer, param_groups

# Eager steps run (and then undone) before a capture: lazy optimizer state, allocator and library warm-up.
GRAPH_WARMUP_STEPS = 3


def to_device_layout(x: torch.Tensor, trainable: Trainable, runtime: Runtime) -> torch.Tensor:
    if trainable.conv and runtime.channels_last and x.ndim == 4:
        return x.contiguous(memory_format=torch.channels_last)
    return x


def graphs_plan(setting: bool | str, runtime: Runtime, cfg: TrainParams, distributed: bool = False
                ) -> tuple[bool, str | None]:
    """Whether the step is captured as a CUDA graph (`base.cuda_graphs`: auto, true or false), and why not when it
    cannot be (None when there is nothing to say: graphs on, off by request, or auto on a CPU)."""
    wanted, why = auto.cuda_graphs(setting, runtime.device.type)
    if wanted is False:
        return False, why
    reasons = [
        (distributed, "DDP's gradient all-reduce runs in backward hooks outside the graph"),
        (runtime.compile, "torch.compile manages its own graphs (compile's mode='reduce-overhead')"),
        (cfg.accumulation_steps > 1, "accumulation_steps > 1"),
        (runtime.precision == "fp16", "fp16's GradScaler reads its inf check on the host"),
        (cfg.activation_checkpointing, "activation checkpointing re-runs forward outside the captured stream"),
    ]
    why = next((text for hit, text in reasons if hit), None)
    return why is None, why


class TrainStep:
    """One micro-batch of training per call, one optimizer step per `accumulation_steps` calls.

    Losses and the first non-finite step are accumulated on the device (`loss_sum`, `seen`, `first_bad`) and read
    by the caller at log points: the step itself never waits for the device. With `graphs`, the whole update
    (augmentation from a device generator, forward, loss, backward, clipping, capturable fused AdamW or fused SGD
    with the scheduled LR computed on the device, EMA) is captured once as a CUDA graph and replayed; batches are
    copied into its static inputs, so every batch must have the first one's shapes (fit drops the last partial
    batch).
    """

    def __init__(self, trainable: Trainable, model: nn.Module, cfg: TrainParams, runtime: Runtime, *,
                 total_updates: int, warmup_updates: int = 0, seed: int = 0, forward: nn.Module | None = None,
                 graphs: bool = False):
        device = runtime.device
        self.trainable, self.model, self.cfg, self.runtime = trainable, model, cfg, runtime
        self.forward = forward if forward is not None else model
        self.graphs = graphs
        groups = param_groups(model, cfg.optimizer_weight_decay, cfg.lr, trainable.head, trainable.head_lr)
        self.optimizer = build_optimizer(groups, cfg, device, capturable=graphs)
        self.schedule = LRSchedule(self.optimizer, total_updates, min(warmup_updates, total_updates), cfg.schedule)
        self.scaler = torch.amp.GradScaler(device.type) if runtime.needs_grad_scaler else None
        self.ema = EMA(model, cfg.ema_decay) if cfg.ema_decay else None
        self.seed = seed
        self.augment = generator(seed, "augment", device=device) if cfg.augments else None
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.loss_sum = torch.zeros((), device=device)
        self.seen = torch.zeros((), dtype=torch.long, device=device)
        self.first_bad = torch.full((), -1, dtype=torch.long, device=device)
        self.update_count = torch.zeros((), dtype=torch.long, device=device)  # the device's copy of `updates`
        self.updates = 0  # optimizer steps done
        self.micro = 0  # micro-batches since the last optimizer step
        self._graph: torch.cuda.CUDAGraph | None = None
        self._static: Batch | None = None

    @property
    def eval_model(self) -> nn.Module:
        """The weights to evaluate and keep: the EMA copy when EMA is on."""
        return self.ema.module if self.ema is not None else self.model

    def __call__(self, batch: Batch) -> bool:
        """Train on one micro-batch; True when it completed an optimizer step."""
        if self.graphs:
            if self._graph is None:
                self._capture(batch)
            for key, static in self._static.items():
                static.copy_(batch[key])
            self._graph.replay()
            self.updates += 1
            return True
        self._accumulate(batch)
        self.micro += 1
        if self.micro < self.cfg.accumulation_steps:
            return False
        self.micro = 0
        self._update(self.updates)
        self.updates += 1
        return True

    def _accumulate(self, batch: Batch) -> None:
        trainable, runtime = self.trainable, self.runtime
        x, y = trainable.prepare_batch(batch, True, self.augment)
        x = to_device_layout(x, trainable, runtime)
        with runtime.autocast():
            loss = trainable.loss_fn(self.forward(x), y)
        scaled = loss / self.cfg.accumulation_steps
        (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
        loss = loss.detach().float()
        self.first_bad.copy_(torch.where(~torch.isfinite(loss) & (self.first_bad < 0), self.update_count,
                                         self.first_bad))
        self.loss_sum += loss * y.shape[0]
        self.seen += y.shape[0]

    def _update(self, step: int | torch.Tensor, zero_grad: bool = True) -> None:
        """Clip, step the optimizer at the LR of optimizer step `step` (host int or device tensor), update EMA."""
        self.schedule.set(step)
        if self.cfg.grad_clip:
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)
            self._clip()
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        if zero_grad:
            self.optimizer.zero_grad(set_to_none=True)
        if self.ema is not None:
            self.ema.update(self.update_count)
        self.update_count += 1

    def _clip(self) -> None:
        """clip_grad_norm_. On a CPU the norm is read on the host, which costs nothing there, and the gradients are
        multiplied only when the factor is below 1 (clip_grad_norm_ always multiplies, by exactly 1.0 when the norm
        is within the limit: a pass over every gradient, 1.2 of the text bag's 9 ms per step): the same bits."""
        if self.runtime.device.type != "cpu":
            nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip)
            return
        grads = [p.grad for p in self.params if p.grad is not None]
        norm = nn.utils.get_total_norm(grads)
        if not float(self.cfg.grad_clip / (norm + 1e-6)) >= 1.0:  # `not >=`: a NaN norm multiplies, as torch's does
            nn.utils.clip_grads_with_norm_(self.params, self.cfg.grad_clip, norm)

    # --- CUDA graph -------------------------------------------------------------------------------------------------

    def _mutable_tensors(self) -> list[torch.Tensor]:
        """Every tensor an update writes to (the same objects on every call): weights, buffers, EMA, optimizer
        state, tensor LRs, counters."""
        tensors = [*self.model.parameters(), *self.model.buffers()]
        if self.ema is not None:
            tensors += [*self.ema.module.parameters(), *self.ema.module.buffers()]
        for state in self.optimizer.state.values():
            tensors += [t for t in state.values() if torch.is_tensor(t)]
        tensors += [g["lr"] for g in self.optimizer.param_groups if torch.is_tensor(g["lr"])]
        return tensors + [self.loss_sum, self.seen, self.first_bad, self.update_count]

    def _rng_states(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        device = self.runtime.device
        default = torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()
        return default, self.augment.get_state() if self.augment is not None else None

    def warm_up_and_undo(self, batch: Batch, steps: int) -> None:
        """Run `steps` updates on `batch` (creating the optimizer's lazy state, warming allocator and libraries),
        then put back every tensor they wrote and the RNG states: as if they had never run, except that the
        optimizer's state tensors now exist (zero, as before a first step, when they did not)."""
        saved = [(t, t.detach().clone()) for t in self._mutable_tensors()]
        default_rng, augment_rng = self._rng_states()
        for _ in range(steps):
            self._accumulate(batch)
            self._update(self.update_count)
        kept = {id(t) for t, _ in saved}
        with torch.no_grad():
            for tensor, copy in saved:
                tensor.copy_(copy)
            for tensor in self._mutable_tensors():
                if id(tensor) not in kept:
                    tensor.zero_()
        if self.runtime.device.type == "cuda":
            torch.cuda.set_rng_state(default_rng, self.runtime.device)
        else:
            torch.set_rng_state(default_rng)
        if self.augment is not None:
            self.augment.set_state(augment_rng)
        self.optimizer.zero_grad(set_to_none=True)

    def _capture(self, batch: Batch) -> None:
        """Capture one update as a CUDA graph. The warm-up updates a capture needs are undone first, so a graphed
        run's numbers do not depend on when it was captured: a resumed run replays the same updates as an
        uninterrupted one."""
        self._static = {k: v.clone() for k, v in batch.items()}
        device = self.runtime.device
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            self.warm_up_and_undo(self._static, GRAPH_WARMUP_STEPS)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        if self.augment is not None:
            graph.register_generator_state(self.augment)
        # thread_local: the MLflow thread of a training stage may run while this thread captures
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            self._accumulate(self._static)
            self._update(self.update_count, zero_grad=False)
        self._graph = graph

    # --- checkpoint state -------------------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {
            "optimizer": self.optimizer.state_dict(), "updates": self.updates,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "augment": self.augment.get_state() if self.augment is not None else None,
            "loss_sum": self.loss_sum.detach().cpu(), "seen": self.seen.detach().cpu(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore what state_dict saved (CPU tensors); the device tensors the step (or its graph) uses stay the
        same objects and are written in place."""
        load_optimizer_state(self.optimizer, state["optimizer"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        if self.ema is not None and state.get("ema") is not None:
            self.ema.load_state_dict(state["ema"])
        self.updates = int(state["updates"])
        if self.augment is not None and state.get("augment") is not None:
            if not restore_generator(self.augment, state["augment"], self.seed, self.updates):
                print(f"{self.trainable.name}: the checkpoint's augmentation RNG state is another device's kind; "
                      f"augmentation reseeded (deterministically) at optimizer step {self.updates}", flush=True)
        self.update_count.fill_(self.updates)
        self.loss_sum.copy_(state["loss_sum"])
        self.seen.copy_(state["seen"])


def load_optimizer_state(optimizer: torch.optim.Optimizer, saved: dict) -> None:
    """Load a saved optimizer state into `optimizer`, which may live on another device with other kernels. The
    loaded groups would bring their saved LR (stale: the schedule sets it; and a tensor LR must stay the object a
    graph reads) and their saved kernel flags (capturable, fused, foreach): this optimizer's are kept, and its state
    tensors placed for them (place_optimizer_state)."""
    kept = [{k: g[k] for k in ("lr", "capturable", "fused", "foreach") if k in g} for g in optimizer.param_groups]
    optimizer.load_state_dict(saved)
    for group, own in zip(optimizer.param_groups, kept):
        group.update(own)
    place_optimizer_state(optimizer)


def place_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Every optimizer state tensor where this optimizer's kernels read it: on its parameter's device, except the step
    count of a group that is neither fused nor capturable, which torch keeps on the CPU. torch's load_state_dict
    places the step by the flags of the groups it loads, not of this optimizer's, so a checkpoint of a CPU run
    (foreach AdamW: step on the CPU) resumed on CUDA (fused or capturable AdamW) would keep every step count on the
    CPU, and the fused kernel or the CUDA graph would fail on it."""
    for group in optimizer.param_groups:
        on_device = bool(group.get("fused") or group.get("capturable"))
        for param in group["params"]:
            state = optimizer.state.get(param)
            for key, value in (state or {}).items():
                if not torch.is_tensor(value):
                    continue
                if key == "step":
                    target = param.device if on_device else torch.device("cpu")
                    state[key] = value.to(device=target, dtype=torch.float32)
                else:
                    state[key] = value.to(device=param.device)


def restore_generator(gen: torch.Generator, state: torch.Tensor, seed: int, updates: int) -> bool:
    """Put `gen` back to a saved state; True when it could be. A state of another kind of generator (a CPU
    generator's Mersenne Twister vs a CUDA generator's Philox seed and offset: a checkpoint from another device)
    cannot be restored: `gen` is then reseeded from (seed, updates), deterministic but not the draws the uninterrupted
    run would have made, and False is returned."""
    state = state.detach().cpu()
    if state.numel() == gen.get_state().numel():
        gen.set_state(state)
        return True
    gen.manual_seed(derived_seed(seed, "augment", "resumed", updates))
    return False
