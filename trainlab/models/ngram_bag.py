"""fastText-style text classifier: mean of embeddings of word ids and hashed word n-grams, then a linear head."""

from __future__ import annotations

import torch
from torch import nn

# Multipliers of the n-gram hash (id_1 * M1 + id_2 * M2 + ...) mod buckets: large odd constants that keep
# products of ids below 2**63 for vocabularies up to millions of words.
HASH_MULTIPLIERS = (1_000_003, 998_244_353, 19_260_817)


def ngram_ids(tokens: torch.Tensor, vocab_size: int, ngrams: int, buckets: int, pad_id: int) -> torch.Tensor:
    """(N, L) word ids -> (N, L + (L-1) + ...) ids of the words and of their hashed 2..ngrams-grams.

    The n-gram starting at position i gets id ``vocab_size + hash(ids) % buckets``; an n-gram that reaches into
    padding gets `pad_id`, which the bag leaves out. Pure tensor ops: no host sync, same shape every batch."""
    parts = [tokens]
    real = tokens != pad_id
    for n in range(2, ngrams + 1):
        if tokens.size(1) < n:
            break
        width = tokens.size(1) - n + 1
        code = torch.zeros_like(tokens[:, :width])
        valid = torch.ones_like(real[:, :width])
        for j in range(n):
            code = code + tokens[:, j:j + width] * HASH_MULTIPLIERS[j]
            valid = valid & real[:, j:j + width]
        # n is folded in so that a bigram and a trigram of the same sum land apart
        hashed = vocab_size + (code + n) % buckets
        parts.append(torch.where(valid, hashed, torch.full_like(hashed, pad_id)))
    return torch.cat(parts, dim=1)


class NgramBag(nn.Module):
    """Token ids (N, L) -> logits (N, num_classes): mean of the embeddings of the words and their hashed n-grams
    (padding left out), dropout, one linear layer."""

    def __init__(self, vocab_size: int, num_classes: int, max_length: int, pad_id: int = 0, dim: int = 64,
                 ngrams: int = 2, buckets: int = 65536, dropout: float = 0.0):
        super().__init__()
        self.vocab_size, self.max_length, self.pad_id = vocab_size, max_length, pad_id
        self.ngrams, self.buckets = ngrams, buckets if ngrams > 1 else 0
        self.bag = nn.EmbeddingBag(vocab_size + self.buckets, dim, mode="mean", padding_idx=pad_id)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(dim, num_classes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # fastText's init: small uniform embeddings, a zero classifier (every class starts equally likely)
        dim = self.bag.embedding_dim
        nn.init.uniform_(self.bag.weight, -1 / dim, 1 / dim)
        with torch.no_grad():
            self.bag.weight[self.pad_id].zero_()
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def ids(self, tokens: torch.Tensor) -> torch.Tensor:
        return ngram_ids(tokens, self.vocab_size, self.ngrams, self.buckets, self.pad_id)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.size(1) > self.max_length:
            raise ValueError(f"sequence length {tokens.size(1)} is longer than the model's max_length {self.max_length}")
        return self.head(self.drop(self.bag(self.ids(tokens))))

    @torch.no_grad()
    def ngram_scores(self, ids: torch.Tensor) -> torch.Tensor:
        """(K,) bag ids -> (K, num_classes): how much one occurrence of each adds to each class's logit."""
        return self.bag.weight[ids].float() @ self.head.weight.float().T
