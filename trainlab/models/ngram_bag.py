"""Bag-of-n-gram text classifiers over word ids and hashed word n-grams: fastText-style (mean of embeddings, then a
linear head) and NB-weighted (NBSVM in neural form: per-class weights scaled by naive-Bayes log-count ratios)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
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
            raise ValueError(f"sequence length {tokens.size(1)} is longer than the model's "
                             f"max_length {self.max_length}")
        return self.head(self.drop(self.bag(self.ids(tokens))))

    @torch.no_grad()
    def ngram_scores(self, ids: torch.Tensor) -> torch.Tensor:
        """(K,) bag ids -> (K, num_classes): how much one occurrence of each adds to each class's logit."""
        return self.bag.weight[ids].float() @ self.head.weight.float().T


# Laplace smoothing of the naive-Bayes counts (Wang and Manning 2012 use 1)
NB_ALPHA = 1.0


def log_count_ratios(ids: torch.Tensor, labels: torch.Tensor, num_features: int, num_classes: int, pad_id: int,
                     alpha: float = NB_ALPHA) -> torch.Tensor:
    """(N, K) bag ids of the training texts and their labels -> (num_features, num_classes) naive-Bayes log-count
    ratios, one class against the rest: r[f, c] = log(p_c[f] / |p_c|) - log(q_c[f] / |q_c|), where p_c[f] - alpha
    counts the texts of class c holding feature f at least once (NBSVM's binarised counts) and q_c the other texts."""
    ids, labels = ids.cpu(), labels.cpu().long()
    ordered = ids.sort(dim=1).values
    first = torch.ones_like(ordered, dtype=torch.bool)
    first[:, 1:] = ordered[:, 1:] != ordered[:, :-1]  # each feature once per text
    keep = first & (ordered != pad_id)
    key = labels.unsqueeze(1).expand_as(ordered)[keep] * num_features + ordered[keep]
    per_class = torch.bincount(key, minlength=num_classes * num_features).view(num_classes, num_features).double()
    p = per_class + alpha
    q = per_class.sum(0) - per_class + alpha
    ratios = (p / p.sum(1, keepdim=True)).log() - (q / q.sum(1, keepdim=True)).log()
    ratios[:, pad_id] = 0
    return ratios.T.float().contiguous()


class NBNgramBag(nn.Module):
    """Token ids (N, L) -> logits (N, num_classes): bias + mean over the words and hashed n-grams f of a text of
    w[f] * r[f] (per class), where r holds the naive-Bayes log-count ratios of the training split (`fit_ratios`,
    saved with the weights as the buffer `ratios`) and w is learnt from zero. Features with strong class evidence
    thus start with a large effective learning rate and a weak pull of weight decay. `dropout` drops whole n-grams
    of a text while training."""

    def __init__(self, vocab_size: int, num_classes: int, max_length: int, pad_id: int = 0, ngrams: int = 2,
                 buckets: int = 65536, dropout: float = 0.0):
        super().__init__()
        self.vocab_size, self.num_classes, self.max_length, self.pad_id = vocab_size, num_classes, max_length, pad_id
        self.ngrams, self.buckets, self.dropout = ngrams, buckets if ngrams > 1 else 0, dropout
        features = vocab_size + self.buckets
        self.weight = nn.Parameter(torch.zeros(features, num_classes))
        self.bias = nn.Parameter(torch.zeros(num_classes))
        # all ones until fit_ratios: an unweighted linear bag
        self.register_buffer("ratios", torch.ones(features, num_classes))

    def ids(self, tokens: torch.Tensor) -> torch.Tensor:
        return ngram_ids(tokens, self.vocab_size, self.ngrams, self.buckets, self.pad_id)

    @torch.no_grad()
    def fit_ratios(self, tokens: torch.Tensor, labels: torch.Tensor) -> None:
        """Set the ratios from the training split's token ids and labels (and from nothing else)."""
        self.ratios.copy_(log_count_ratios(self.ids(tokens.cpu()), labels, self.ratios.size(0), self.num_classes,
                                           self.pad_id))

    def fit_statistics(self, tokens: torch.Tensor, labels: torch.Tensor, vocab: Sequence[str] | None) -> None:
        """What training sets from the training split before the first step (the text task calls it): the ratios."""
        self.fit_ratios(tokens, labels)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.size(1) > self.max_length:
            raise ValueError(f"sequence length {tokens.size(1)} is longer than the model's "
                             f"max_length {self.max_length}")
        ids = self.ids(tokens)
        keep = ids != self.pad_id
        if self.training and self.dropout:
            keep = keep & (torch.rand(ids.shape, device=ids.device) >= self.dropout)
        keep = keep.to(self.weight.dtype)
        # scaling the whole (features, classes) table is cheaper than scaling the gathered (N, K, classes) rows, and
        # lets the fused embedding_bag kernel do the gather and the sum
        summed = F.embedding_bag(ids, self.weight * self.ratios, mode="sum", per_sample_weights=keep)
        return summed / keep.sum(1, keepdim=True).clamp(min=1) + self.bias

    @torch.no_grad()
    def ngram_scores(self, ids: torch.Tensor) -> torch.Tensor:
        """(K,) bag ids -> (K, num_classes): what one occurrence of each adds to each class's logit (before the
        mean)."""
        return (self.weight[ids] * self.ratios[ids]).float()


def build(p, vocab_size: int, num_classes: int, max_length: int, pad_id: int = 0) -> NgramBag:
    """ngram_bag for text section `p` (its own fastText init, not text.init)."""
    model = NgramBag(vocab_size, num_classes, max_length, pad_id, p.d_model, p.ngrams, p.buckets, p.dropout)
    model.config = {"task": "text", "arch": "ngram_bag", "d_model": p.d_model, "ngrams": p.ngrams,
                    "buckets": p.buckets, "dropout": p.dropout, "vocab_size": vocab_size, "num_classes": num_classes,
                    "max_length": max_length, "pad_id": pad_id}
    return model


def build_nb(p, vocab_size: int, num_classes: int, max_length: int, pad_id: int = 0) -> NBNgramBag:
    """nb_bag for text section `p`."""
    model = NBNgramBag(vocab_size, num_classes, max_length, pad_id, p.ngrams, p.buckets, p.dropout)
    model.config = {"task": "text", "arch": "nb_bag", "ngrams": p.ngrams, "buckets": p.buckets,
                    "dropout": p.dropout, "vocab_size": vocab_size, "num_classes": num_classes,
                    "max_length": max_length, "pad_id": pad_id}
    return model
