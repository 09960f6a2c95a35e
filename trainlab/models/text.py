"""The text classifier of `text.arch`, from its task's table (trainlab.models.architectures): the Transformer
(trainlab.models.transformer), the n-gram bags (trainlab.models.ngram_bag) or the TF-IDF bag
(trainlab.models.tfidf_bag)."""

from __future__ import annotations

from torch import nn

from trainlab.models import architectures
from trainlab.models.transformer import Block, SelfAttention, TextTransformer  # noqa: F401 - re-exported


def build_text_model(p, vocab_size: int, num_classes: int, max_length: int, pad_id: int = 0) -> nn.Module:
    """The text.arch classifier (section `p`) over token ids of at most `max_length` tokens."""
    return architectures.build("text", p, vocab_size=vocab_size, num_classes=num_classes, max_length=max_length,
                               pad_id=pad_id)
