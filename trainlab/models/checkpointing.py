"""Activation checkpointing of one block: recompute its activations in backward instead of keeping them."""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def checkpoint_block(block: nn.Module, *args, enabled: bool):
    """`block(*args)`, with activations recomputed in backward when enabled and training (BatchNorm stats move once)."""
    if not (enabled and block.training and torch.is_grad_enabled()):
        return block(*args)
    return checkpoint(
        block, *args, use_reentrant=False, context_fn=lambda: (contextlib.nullcontext(), _restore_buffers(block))
    )


@contextlib.contextmanager
def _restore_buffers(module: nn.Module):
    """Undo buffer updates (BatchNorm running stats) made while a checkpointed block is recomputed."""
    saved = [buf.clone() for buf in module.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for buf, old in zip(module.buffers(), saved):
                buf.copy_(old)
