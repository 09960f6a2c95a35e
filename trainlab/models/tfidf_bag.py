"""TF-IDF bag text classifier: logistic regression in neural form over the words, hashed word n-grams and hashed
character n-grams of the words (fastText's subwords) of a text, TF-IDF weighted and L2-normalised."""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import torch
from torch import nn

from trainlab.models.ngram_bag import ngram_ids

# character n-grams kept per word at most (a word of w characters has 3w - 3 n-grams of 3..5 characters: up to
# 12-character words keep all of theirs)
CHAR_SLOTS = 33


def char_ngrams(word: str, low: int, high: int) -> list[str]:
    """The low..high-character n-grams of `word` padded with a space on each side (scikit-learn's char_wb)."""
    padded = f" {word} "
    return [padded[i:i + n] for n in range(low, high + 1) for i in range(len(padded) - n + 1)]


def char_ngram_table(vocab: Sequence[str], rows: int, low: int, high: int, buckets: int, offset: int, pad_id: int,
                     special: int = 3, slots: int = CHAR_SLOTS) -> torch.Tensor:
    """(rows, slots) int64: for each vocabulary entry, the ids ``offset + crc32(n-gram) % buckets`` of its character
    n-grams (stable across processes and machines), `pad_id` in unused slots; the first `special` entries ([PAD],
    [UNK], [CLS]) and the rows past the vocabulary (hashed out-of-vocabulary ids) have none."""
    table = torch.full((rows, slots), pad_id, dtype=torch.int64)
    for i, word in enumerate(vocab[:rows]):
        if i < special:
            continue
        ids = [offset + zlib.crc32(g.encode("utf-8")) % buckets for g in char_ngrams(word, low, high)][:slots]
        table[i, :len(ids)] = torch.tensor(ids, dtype=torch.int64)
    return table


class TfidfBag(nn.Module):
    """Token ids (N, L) -> logits (N, num_classes): a linear layer over two TF-IDF vectors of the text, each
    L2-normalised: its words and hashed 2..ngrams-grams of them (`ngram_ids`), and the hashed character n-grams of
    its words (the buffer `char_table`, filled by `fit_vocabulary`). A feature counts once per occurrence, weighted
    by its idf (smooth, as scikit-learn's; zero for a feature that no training text has), computed from the
    training split by `fit_idf` and saved with the weights. Each vector's norm treats occurrences as distinct
    features, which keeps the step to gathers and sums (no sort, no host sync). `dropout` drops features while
    training, before the normalisation."""

    def __init__(self, vocab_size: int, num_classes: int, max_length: int, pad_id: int = 0, ngrams: int = 2,
                 buckets: int = 65536, char_ngrams: tuple[int, int] | None = (3, 5), char_buckets: int = 65536,
                 dropout: float = 0.0):
        super().__init__()
        self.vocab_size, self.num_classes, self.max_length, self.pad_id = vocab_size, num_classes, max_length, pad_id
        self.ngrams, self.buckets = ngrams, buckets if ngrams > 1 else 0
        self.char_ngrams = tuple(char_ngrams) if char_ngrams else None
        self.char_buckets = char_buckets if self.char_ngrams else 0
        self.dropout = dropout
        features = vocab_size + self.buckets + self.char_buckets
        self.weight = nn.Parameter(torch.zeros(features, num_classes))
        self.bias = nn.Parameter(torch.zeros(num_classes))
        slots = CHAR_SLOTS if self.char_ngrams else 0
        self.register_buffer("char_table", torch.full((vocab_size, slots), pad_id, dtype=torch.int64))
        # all ones (the pad feature zero) until fit_idf: term counts only
        idf = torch.ones(features)
        idf[pad_id] = 0
        self.register_buffer("idf", idf)

    @torch.no_grad()
    def fit_vocabulary(self, vocab: Sequence[str]) -> None:
        """Fill the character n-gram table from the tokenizer's vocabulary (id -> word)."""
        if self.char_ngrams:
            low, high = self.char_ngrams
            self.char_table.copy_(char_ngram_table(vocab, self.vocab_size, low, high, self.char_buckets,
                                                   self.vocab_size + self.buckets, self.pad_id))

    def fit_statistics(self, tokens: torch.Tensor, labels: torch.Tensor, vocab: Sequence[str] | None) -> None:
        """What training sets from the training split before the first step (the text task calls it): the words'
        character n-grams from the prepared tokenizer's vocabulary, then idf of the training texts."""
        if vocab is None and self.char_ngrams:
            raise ValueError("the TF-IDF bag needs the prepared tokenizer's vocabulary (tokenizer.json beside the "
                             "prepared text data) to fit its statistics")
        if vocab is not None:
            self.fit_vocabulary(vocab)
        self.fit_idf(tokens)

    def word_ids(self, tokens: torch.Tensor) -> torch.Tensor:
        """(N, L) token ids -> (N, K) ids of the words and their hashed n-grams."""
        return ngram_ids(tokens, self.vocab_size, self.ngrams, self.buckets, self.pad_id)

    def char_ids(self, tokens: torch.Tensor) -> torch.Tensor:
        """(N, L) token ids -> (N, L * CHAR_SLOTS) ids of each word's character n-grams (none: (N, 0))."""
        return self.char_table[tokens].flatten(1)

    @torch.no_grad()
    def fit_idf(self, tokens: torch.Tensor) -> None:
        """Set idf from the training split's token ids (and from nothing else): ln((1 + n) / (1 + df)) + 1, where df
        counts the texts holding a feature; 0 for the features that no training text holds."""
        tokens = tokens.cpu()
        features = self.idf.numel()
        rows = torch.arange(tokens.size(0)).unsqueeze(1)
        df = torch.zeros(features, dtype=torch.float64)
        for ids in (self.word_ids(tokens), self.char_ids(tokens)):
            real = ids != self.pad_id
            pairs = torch.unique((rows * features + ids)[real])  # each (text, feature) once
            df += torch.bincount(pairs % features, minlength=features).double()
        n = tokens.size(0)
        idf = torch.where(df > 0, ((1 + n) / (1 + df)).log() + 1, torch.zeros_like(df))  # padding: df 0, idf 0
        self.idf.copy_(idf.float())

    def normalised_weights(self, ids: torch.Tensor) -> torch.Tensor:
        weights = self.idf[ids]
        if self.training and self.dropout:
            weights = weights * (torch.rand(ids.shape, device=ids.device) >= self.dropout)
        return weights / weights.square().sum(1, keepdim=True).sqrt().clamp(min=1e-12)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.size(1) > self.max_length:
            raise ValueError(f"sequence length {tokens.size(1)} is longer than the model's max_length {self.max_length}")
        words, chars = self.word_ids(tokens), self.char_ids(tokens)
        ids = torch.cat([words, chars], dim=1)
        weights = torch.cat([self.normalised_weights(words), self.normalised_weights(chars)], dim=1)
        # index_select + a weighted sum: on CPU its backward (index_add) is about 4x faster than embedding_bag's
        rows = self.weight.index_select(0, ids.flatten()).view(*ids.shape, -1)
        return (rows * weights.to(rows.dtype).unsqueeze(-1)).sum(1) + self.bias

    @torch.no_grad()
    def ngram_scores(self, ids: torch.Tensor) -> torch.Tensor:
        """(K,) feature ids -> (K, num_classes): what one occurrence adds to each class's logit, before the norm."""
        return (self.weight[ids] * self.idf[ids, None]).float()
