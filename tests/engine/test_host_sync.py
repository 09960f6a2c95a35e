"""No host sync in any task's training step, caught on the CPU before a GPU sees it.

On CUDA a `.item()`, `.tolist()`, `.cpu()`, `float(t)`, `if t:` or a boolean-mask index inside the step waits for
the device (and is an error under CUDA graph capture). Each registered task's step (the prepare, forward, loss,
backward and on-device bookkeeping of `TrainStep._accumulate`, and the eval prepare, forward and loss), with every
augmentation its params can choose, and the tests' tiny tasks run here under two modes that turn such a call into
an error: a TorchFunctionMode for the Python-level calls and a TorchDispatchMode for the aten ops that read a value
back (`_local_scalar_dense`, `nonzero`, `masked_select`, `unique`, bool-mask `index`/`index_put_`). The optimizer
step is left out: the CPU's non-capturable AdamW reads its step count on the host, which the CUDA kernels do not.

Why modes and not `torch.compile(fullgraph=True, backend="eager")` or `torch.export` (measured with torch 2.14.1):
dynamo refuses the `torch.Generator` the augmentations take ("Failed to convert args/kwargs to proxy"), and both
dynamo's fullgraph trace and make_fx's fake/symbolic trace accept `.item()`, `.cpu()` and `x[mask]` without an error
(an unbacked symbol, a no-op, a dynamic shape), so they would not catch what this test exists for.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from trainlab.core.config import BaseParams, ClassifierParams, Params, SegmenterParams, TextParams
from trainlab.core.runtime import resolve_runtime
from trainlab.engine.contract import Trainable
from trainlab.engine.step import TrainStep, to_device_layout

aten = torch.ops.aten

# Tensor methods that bring a value (or the whole tensor) to the host.
SYNC_METHODS = {"item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "__index__", "__complex__"}
# aten ops that read a device value on the host: a scalar, or an output size that depends on the data.
SYNC_OPS = {aten._local_scalar_dense, aten.nonzero, aten.masked_select, aten._unique, aten._unique2,
            aten.unique_dim, aten.unique_consecutive, aten.bincount, aten.histc}


class HostSync(AssertionError):
    """A call in a training step that waits for the device."""


def _is_cpu(device) -> bool:
    return device is not None and not isinstance(device, torch.dtype) and torch.device(device).type == "cpu" \
        if isinstance(device, (str, torch.device)) else False


class _NoSyncOps(TorchDispatchMode):
    allowed = 0  # > 0 within a CPU_ONLY_CHECKS call

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = func.overloadpacket
        if self.allowed:
            return func(*args, **kwargs)
        if packet in SYNC_OPS:
            raise HostSync(f"{func} in a training step: reads a device value on the host on CUDA")
        if packet in (aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_) and any(
                torch.is_tensor(i) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else []) or []
                if i is not None):
            raise HostSync(f"{func} with a boolean mask in a training step: its size is read on the host on CUDA")
        if packet is aten.repeat_interleave and kwargs.get("output_size") is None and len(args) < 3:
            raise HostSync(f"{func} without output_size in a training step: a host sync on CUDA")
        return func(*args, **kwargs)


# Ops whose value checks read the data on the host on a CPU only (on CUDA they rely on device asserts): F.one_hot
# with num_classes given checks min >= 0 and max < num_classes with `.item()` except on CUDA (ATen's Onehot.cpp).
CPU_ONLY_CHECKS = {"one_hot": lambda args, kwargs: len(args) > 1 or kwargs.get("num_classes", -1) != -1}


class _NoHostCalls(TorchFunctionMode):
    def __init__(self, ops: _NoSyncOps):
        super().__init__()
        self.ops = ops

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in CPU_ONLY_CHECKS and CPU_ONLY_CHECKS[name](args, kwargs):
            self.ops.allowed += 1
            try:
                return func(*args, **kwargs)
            finally:
                self.ops.allowed -= 1
        if name in SYNC_METHODS:
            raise HostSync(f"Tensor.{name}() in a training step: a host sync on CUDA")
        if name == "to" and (_is_cpu(kwargs.get("device")) or any(_is_cpu(a) for a in args[1:])):
            raise HostSync("Tensor.to('cpu') in a training step: a host sync on CUDA")
        if func in (torch.tensor, torch.as_tensor) and kwargs.get("device") is not None:
            raise HostSync(f"torch.{name}(..., device=) in a training step: a blocking host-to-device copy on CUDA")
        return func(*args, **kwargs)


class no_host_sync:
    """Within: every host-syncing call raises HostSync."""

    def __enter__(self):
        ops = _NoSyncOps()
        self._modes = [_NoHostCalls(ops), ops]
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc):
        for mode in reversed(self._modes):
            mode.__exit__(*exc)
        return False


def assert_step_never_syncs(task: Trainable, cfg, batch: dict[str, torch.Tensor]) -> None:
    """The training micro-step (prepare with augmentation, forward, loss, backward, bookkeeping) and the eval
    prepare, forward and loss of `task` on `batch`, twice each (lazy state on the first call), under no_host_sync."""
    runtime = resolve_runtime(BaseParams(device="cpu", precision="fp32"))
    step = TrainStep(task, task.model, cfg.model_copy(update={"ema_decay": 0.99}), runtime, total_updates=10,
                     warmup_updates=2, seed=0)
    task.model.train()
    with no_host_sync():
        for _ in range(2):
            step._accumulate(batch)
    task.model.eval()
    with torch.no_grad(), no_host_sync():
        x, y = task.prepare_batch(batch, False, None)
        task.loss_fn(task.model(to_device_layout(x, task, runtime)), y)


def images(n: int, channels: int = 1, size: int = 28) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"images": torch.randint(0, 256, (n, channels, size, size), generator=g, dtype=torch.uint8),
            "labels": torch.randint(0, 10, (n,), generator=g)}


def masks(n: int, size: int = 32) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"images": torch.randint(0, 256, (n, 1, size, size), generator=g, dtype=torch.uint8),
            "masks": torch.randint(0, 3, (n, size, size), generator=g, dtype=torch.uint8)}


def tokens(n: int, length: int = 16, vocab: int = 60) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    t = torch.randint(3, vocab, (n, length), generator=g)
    t[::2, length // 2:] = 0  # padding
    return {"tokens": t, "labels": torch.randint(0, 3, (n,), generator=g)}


# (id, params section, its overrides, meta, batch): every registered task and each augmentation path its data can pick
REGISTERED = [
    ("classifier-digits", "classifier", {"width": 8}, {"num_classes": 10, "channels": 1}, lambda: images(4)),
    ("classifier-hflip", "classifier", {"width": 8}, {"num_classes": 10, "channels": 3, "hflip": True},
     lambda: images(4, 3, 32)),
    ("classifier-photo", "classifier", {"width": 8}, {"num_classes": 10, "channels": 3, "hflip": True,
                                                     "augment": "photo"}, lambda: images(4, 3, 32)),
    ("classifier-no-augment", "classifier", {"width": 8, "augment": False, "label_smoothing": 0.1},
     {"num_classes": 10, "channels": 1}, lambda: images(4)),
    ("segmenter", "segmenter", {"base_channels": 4, "depth": 2}, {"num_classes": 3, "channels": 1},
     lambda: masks(2)),
    ("segmenter-crop-dihedral", "segmenter", {"base_channels": 4, "depth": 2, "crop_size": 16},
     {"num_classes": 3, "channels": 1, "symmetries": "dihedral"}, lambda: masks(2)),
    ("text-transformer", "text", {"arch": "transformer", "d_model": 16, "n_heads": 2, "dim_feedforward": 16},
     {"num_classes": 3, "vocab_size": 60, "max_length": 16}, lambda: tokens(4)),
    ("text-transformer-cls", "text", {"arch": "transformer", "d_model": 16, "n_heads": 2, "dim_feedforward": 16,
                                      "pooling": "cls"}, {"num_classes": 3, "vocab_size": 60, "max_length": 16},
     lambda: tokens(4)),
    ("text-ngram_bag", "text", {"arch": "ngram_bag", "buckets": 256}, {"num_classes": 3, "vocab_size": 60,
                                                                      "max_length": 16}, lambda: tokens(4)),
    ("text-nb_bag", "text", {"arch": "nb_bag", "buckets": 256}, {"num_classes": 3, "vocab_size": 60,
                                                                "max_length": 16}, lambda: tokens(4)),
    ("text-tfidf_bag", "text", {"arch": "tfidf_bag", "optimizer": "sgd", "buckets": 256, "char_buckets": 256},
     {"num_classes": 3, "vocab_size": 60, "max_length": 16}, lambda: tokens(4)),
    ("text-tfidf_bag-auto", "text", {"arch": "tfidf_bag", "optimizer": "sgd", "buckets": 256, "char_buckets": 256,
                                     "weight_decay": "auto"}, {"num_classes": 3, "vocab_size": 60, "max_length": 16},
     lambda: tokens(4)),
]
PARAMS = {"classifier": ClassifierParams, "segmenter": SegmenterParams, "text": TextParams}


def build(section: str, overrides: dict, meta: dict, batch: dict):
    from trainlab.jobs.train import build_trainable

    params = Params(**{section: PARAMS[section](**overrides)})
    task = build_trainable(section, params, meta)
    model = task.model
    if hasattr(model, "fit_vocabulary"):  # the TF-IDF bag's statistics, fitted as training fits them
        model.fit_vocabulary(["[PAD]", "[UNK]", "[CLS]", *(f"word{i}" for i in range(57))])
        model.fit_idf(batch["tokens"])
        model.host_gather_on_cpu = False  # the candidates' gather CUDA runs (the CPU's finds its slots on the host)
    elif hasattr(model, "fit_ratios"):
        model.fit_ratios(batch["tokens"], batch["labels"])
    return task, getattr(params, section)


@pytest.mark.parametrize("section, overrides, meta, make_batch", [r[1:] for r in REGISTERED],
                         ids=[r[0] for r in REGISTERED])
def test_no_registered_task_step_synchronises_with_the_host(section, overrides, meta, make_batch):
    torch.manual_seed(0)
    batch = make_batch()
    task, cfg = build(section, overrides, meta, batch)
    assert_step_never_syncs(task, cfg, batch)


def test_every_registered_task_is_covered():
    from trainlab import tasks

    assert set(tasks.names()) <= {r[1] for r in REGISTERED}


def test_the_tests_tiny_tasks_never_synchronise_with_the_host():
    from tests.engine.test_loop import CFG, make_trainable, tiny_data
    from tests.tasks.test_registry import CODE as TOY

    assert_step_never_syncs(make_trainable(), CFG, tiny_data(8))
    toy = TOY.make_trainable(torch.nn.Linear(2, 3), {"num_classes": 3})
    assert_step_never_syncs(toy, CFG.model_copy(update={"augment": False}),
                            {"points": torch.randint(0, 10, (4, 2)), "labels": torch.randint(0, 3, (4,))})


def _tiny(prepare_extra) -> Trainable:
    from tests.engine.test_loop import make_trainable

    task = make_trainable()
    base = task.prepare_batch

    def prepare(batch, train, gen):
        x, y = base(batch, train, gen)
        return prepare_extra(x), y

    task.prepare_batch = prepare
    return task


@pytest.mark.parametrize("what, extra", [
    ("tolist", lambda x: torch.roll(x, shifts=x.new_ones(2, dtype=torch.long).tolist(), dims=(2, 3))),
    ("item", lambda x: x * x.max().item()),
    ("cpu", lambda x: x.cpu()),
    ("to('cpu')", lambda x: x.to("cpu")),
    ("__float__", lambda x: x / float(x.std())),
    ("__bool__", lambda x: x if (x > 0).any() else -x),
    ("boolean mask", lambda x: x.masked_fill(x > 2, 0) + x[x > 2].sum()),
    ("torch.tensor", lambda x: x * torch.tensor(0.5, device=x.device)),
])
def test_a_host_sync_put_in_a_step_is_caught(what, extra):
    """The negative cases: each of these in a task's prepare fails the check above."""
    from tests.engine.test_loop import CFG, tiny_data

    with pytest.raises(HostSync):
        assert_step_never_syncs(_tiny(extra), CFG, tiny_data(8))


def test_a_host_sync_in_forward_or_loss_is_caught():
    from tests.engine.test_loop import CFG, make_trainable, tiny_data

    task = make_trainable()
    task.loss_fn = lambda out, y: F.cross_entropy(out.float(), y) * (1 if int(y.max()) < 4 else 0)
    with pytest.raises(HostSync, match="__int__|_local_scalar_dense"):
        assert_step_never_syncs(task, CFG, tiny_data(8))

    class Printing(torch.nn.Module):
        def forward(self, x):
            print(f"mean {x.mean():.3f}")
            return x

    task = make_trainable()
    task.model = torch.nn.Sequential(Printing(), task.model)
    with pytest.raises(HostSync):
        assert_step_never_syncs(task, CFG, tiny_data(8))
