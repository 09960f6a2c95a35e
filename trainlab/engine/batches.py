"""Batches for the engine: device-resident tensors drawn by seeded permutation, or a seeded DataLoader over tensors
in memory or a prepared split streamed from disk; both give the same batches in the same order."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, Dataset

from trainlab.core.repro import generator

Batch = dict[str, torch.Tensor]


def tensors_nbytes(tensors: Batch) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def on_disk(tensors: Batch) -> bool:
    """True when some tensor is a lazy column of a prepared split on disk (trainlab.data.shards), not in memory."""
    return any(not torch.is_tensor(t) for t in tensors.values())


def num_samples(tensors: Batch) -> int:
    return len(next(iter(tensors.values())))


class DeviceBatches:
    """All tensors live on the device; each epoch draws a permutation from (seed, epoch), so any epoch and any step
    within it can be reproduced without replaying earlier ones (that is what makes mid-epoch resume exact)."""

    def __init__(self, tensors: Batch, batch_size: int, device: torch.device, seed: int, shuffle: bool,
                 drop_last: bool, rank: int = 0, world_size: int = 1, repeats: int = 1):
        self.tensors = {k: v.to(device, non_blocking=True) for k, v in tensors.items()}
        self.samples, self.repeats = num_samples(tensors), repeats
        self.n = self.samples * repeats  # an epoch draws each sample `repeats` times (crops of large images)
        self.batch_size, self.device, self.seed = batch_size, device, seed
        self.shuffle, self.rank, self.world_size = shuffle, rank, world_size
        per_rank = self.n // world_size if world_size > 1 else self.n
        self.drop_last = drop_last and per_rank >= batch_size
        self.per_rank = per_rank

    def __len__(self) -> int:
        if self.drop_last:
            return self.per_rank // self.batch_size
        return -(-self.per_rank // self.batch_size)

    def order(self, epoch: int) -> torch.Tensor:
        idx = epoch_order(self.n, self.samples, self.shuffle, self.seed, epoch)
        if self.world_size > 1:
            # Every rank sees the same permutation and takes its own interleaved slice of it.
            idx = idx[: self.per_rank * self.world_size][self.rank :: self.world_size]
        return idx.to(self.device)

    def epoch(self, epoch: int, start_step: int = 0) -> Iterator[Batch]:
        idx = self.order(epoch)
        for step in range(start_step, len(self)):
            sel = idx[step * self.batch_size : (step + 1) * self.batch_size]
            yield {k: v[sel] for k, v in self.tensors.items()}


class _BatchDataset(Dataset):
    """Item i of the loader is a whole batch: the rows an index list names, read in one go (from memory, or from
    disk for a ShardSplit's columns), so a worker reads a batch at a time."""

    def __init__(self, tensors: Batch):
        self.tensors = tensors

    def __len__(self) -> int:
        return num_samples(self.tensors)

    def __getitem__(self, rows: torch.Tensor) -> Batch:
        return {k: v[rows] for k, v in self.tensors.items()}


def _seed_worker(worker_id: int) -> None:
    import random

    import numpy as np

    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


class _EpochBatches(torch.utils.data.Sampler):
    """The index lists of one epoch's batches, set by the main process before each pass (so persistent workers
    serve every epoch, and which worker reads a batch never changes what is in it)."""

    def __init__(self):
        self.batches: list[torch.Tensor] = []

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class LoaderBatches:
    """Data that does not live on the device (or in memory): a DataLoader whose workers read whole batches, in the
    same seeded order as DeviceBatches, prefetched, pinned on CUDA. Augmentation happens later, on the device, in
    the task's batch transform: so the batches, and the training, do not depend on the number of workers."""

    def __init__(self, tensors: Batch, batch_size: int, device: torch.device, seed: int, shuffle: bool,
                 drop_last: bool, num_workers: int = 2, rank: int = 0, world_size: int = 1, repeats: int = 1):
        self.dataset = _BatchDataset(tensors)
        self.samples = len(self.dataset)
        self.n = self.samples * repeats
        self.batch_size, self.device, self.seed, self.shuffle = batch_size, device, seed, shuffle
        self.drop_last = drop_last and self.n // world_size >= batch_size
        self.num_workers, self.rank, self.world_size = num_workers, rank, world_size
        self.sampler = _EpochBatches()
        self.loader = DataLoader(self.dataset, sampler=self.sampler, batch_size=None, num_workers=num_workers,
                                 pin_memory=device.type == "cuda", worker_init_fn=_seed_worker,
                                 persistent_workers=num_workers > 0,
                                 generator=generator(seed, "workers"))  # not the global RNG: training's own

    def __len__(self) -> int:
        per_rank = self.n // self.world_size
        return per_rank // self.batch_size if self.drop_last else -(-per_rank // self.batch_size)

    def order(self, epoch: int) -> torch.Tensor:
        idx = epoch_order(self.n, self.samples, self.shuffle, self.seed, epoch)
        if self.world_size > 1:
            idx = idx[: (self.n // self.world_size) * self.world_size][self.rank :: self.world_size]
        return idx

    def epoch(self, epoch: int, start_step: int = 0) -> Iterator[Batch]:
        idx = self.order(epoch)
        self.sampler.batches = [idx[step * self.batch_size : (step + 1) * self.batch_size]
                                for step in range(start_step, len(self))]
        for batch in self.loader:
            yield {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}


# Evaluation batches of images hold at most this many pixels (about 8 Mpx: 24 images of 584x565, 128 of 256x256),
# so that whole large images (segmentation at its own resolution) cannot exhaust memory at an eval batch size chosen
# for small ones; smaller images keep the batch size asked for.
EVAL_MAX_PIXELS = 2**23


def eval_batch_size(tensors: Batch, batch_size: int) -> int:
    """`batch_size`, lowered for large images to keep a batch within EVAL_MAX_PIXELS."""
    images = [t for t in tensors.values() if len(t.shape) == 4]
    if not images:
        return batch_size
    pixels = images[0].shape[-2] * images[0].shape[-1]
    return max(1, min(batch_size, EVAL_MAX_PIXELS // pixels))


def epoch_order(n: int, samples: int, shuffle: bool, seed: int, epoch: int) -> torch.Tensor:
    """The sample indices of one epoch of `n` draws from `samples` samples (n a multiple of it): a seeded
    permutation of the draws, each draw's sample its index modulo `samples`."""
    idx = torch.randperm(n, generator=generator(seed, "shuffle", epoch)) if shuffle else torch.arange(n)
    return idx % samples if n != samples else idx


def make_batches(tensors: Batch, batch_size: int, device: torch.device, seed: int, shuffle: bool, drop_last: bool,
                 max_device_mb: int, num_workers: int = 2, rank: int = 0, world_size: int = 1, repeats: int = 1):
    """Device-resident batches when the data is in memory and fits in `max_device_mb`, else a DataLoader (data on
    disk is always read through one). `repeats`: each sample is drawn that many times an epoch."""
    if not on_disk(tensors) and tensors_nbytes(tensors) <= max_device_mb * 2**20:
        return DeviceBatches(tensors, batch_size, device, seed, shuffle, drop_last, rank, world_size, repeats)
    return LoaderBatches(tensors, batch_size, device, seed, shuffle, drop_last, num_workers, rank, world_size,
                         repeats)
