"""TF-IDF bag text classifier: logistic regression in neural form over the words, hashed word n-grams and hashed
character n-grams of the words (fastText's subwords) of a text, TF-IDF weighted and L2-normalised; optionally one
head per candidate weight decay over the same features, the one to keep chosen on the validation split."""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from trainlab.core.auto import WEIGHT_DECAY_CANDIDATES  # noqa: F401 - re-exported
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
    filled = []  # one Python list per entry, made a tensor at once (a tensor per word took half the time)
    for i, word in enumerate(vocab[:rows]):
        ids = [] if i < special else [offset + zlib.crc32(g.encode("utf-8")) % buckets
                                      for g in char_ngrams(word, low, high)][:slots]
        filled.append(ids + [pad_id] * (slots - len(ids)))
    table = torch.full((rows, slots), pad_id, dtype=torch.int64)
    if filled and slots:
        table[:len(filled)] = torch.tensor(filled, dtype=torch.int64)
    return table


def gather(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``table[ids]`` by index_select: the same values, 2-4x faster on a CPU than advanced indexing for a
    training step's 200k ids."""
    return table.index_select(0, ids.flatten()).view(*ids.shape, *table.shape[1:])


class _DecayGradient(torch.autograd.Function):
    """0 forward; backward, the gradient ``decay * weight`` (one pass over the weight, no penalty computed)."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, decay: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(weight, decay)
        return weight.new_zeros(())

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        weight, decay = ctx.saved_tensors
        return weight * (decay * grad), None


class _HeldRowsBag(torch.autograd.Function):
    """sum_j weights[:, j] * weight[ids[:, j]] over the slots whose id is not 0 (padding: four fifths of them on the
    tweets), on a CPU: forward, embedding_bag over those slots only; backward, the weight's gradient as one
    index_add of the scaled output gradients (embedding_bag's own backward sorts every index first)."""

    @staticmethod
    def forward(ctx, ids: torch.Tensor, weights: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        held = (ids != 0).flatten().nonzero().squeeze(1)
        flat, flat_weights = ids.flatten().index_select(0, held), weights.flatten().index_select(0, held)
        offsets = torch.zeros(len(ids), dtype=torch.int64, device=ids.device)
        offsets[1:] = (ids[:-1] != 0).sum(1).cumsum(0)
        ctx.save_for_backward(flat, flat_weights, held // ids.size(1))
        ctx.rows = weight.size(0)
        return F.embedding_bag(flat, weight, offsets, per_sample_weights=flat_weights, mode="sum")

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[None, None, torch.Tensor]:
        flat, flat_weights, text = ctx.saved_tensors
        scaled = grad.index_select(0, text) * flat_weights.unsqueeze(1).to(grad.dtype)
        return None, None, grad.new_zeros(ctx.rows, grad.size(1)).index_add_(0, flat, scaled)


class TfidfBag(nn.Module):
    """Token ids (N, L) -> logits (N, num_classes): a linear layer over two TF-IDF vectors of the text, each
    L2-normalised: its words and hashed 2..ngrams-grams of them (`ngram_ids`), and the hashed character n-grams of
    its words (the buffer `char_table`, filled by `fit_vocabulary`). A feature counts once per occurrence, weighted
    by its idf (smooth, as scikit-learn's; zero for a feature that no training text has), computed from the
    training split by `fit_idf` and saved with the weights. Each vector's norm treats occurrences as distinct
    features, which keeps the step to gathers and sums (no sort; no host sync off the CPU). `dropout` drops features
    while training, before the normalisation.

    With `weight_decays` (K candidates) it is K such classifiers over the same features, trained at once: logits
    (N, K, num_classes), head k regularised by its own L2 coefficient through `l2_penalty` (the optimizer then
    decays nothing of the weight); `select_head` returns the chosen one as a plain one-head bag."""

    # The candidates' rows on a CPU: summed over the slots found on the host (_HeldRowsBag); False, or on any other
    # device, by the graph-safe gather (what tests/engine/test_host_sync.py checks on the CPU for CUDA's sake)
    host_gather_on_cpu = True

    def __init__(self, vocab_size: int, num_classes: int, max_length: int, pad_id: int = 0, ngrams: int = 2,
                 buckets: int = 65536, char_ngrams: tuple[int, int] | None = (3, 5), char_buckets: int = 65536,
                 dropout: float = 0.0, weight_decays: Sequence[float] = ()):
        super().__init__()
        self.vocab_size, self.num_classes, self.max_length, self.pad_id = vocab_size, num_classes, max_length, pad_id
        self.ngrams, self.buckets = ngrams, buckets if ngrams > 1 else 0
        self.char_ngrams = tuple(char_ngrams) if char_ngrams else None
        self.char_buckets = char_buckets if self.char_ngrams else 0
        self.dropout = dropout
        self.weight_decays = tuple(float(w) for w in weight_decays)
        if any(not math.isfinite(w) or w < 0 for w in self.weight_decays):
            raise ValueError(f"weight decays must be finite and >= 0, got {list(self.weight_decays)}")
        heads = max(1, len(self.weight_decays))
        features = vocab_size + self.buckets + self.char_buckets
        # candidates: the heads side by side in one matrix, one gather for them all, whose rows are 0 (nothing:
        # padding) and then the features (`rows` maps feature -> row); fit_idf keeps only the features that some
        # training text holds
        self.weight = nn.Parameter(torch.zeros(features + 1 if self.weight_decays else features, heads * num_classes))
        self.bias = nn.Parameter(torch.zeros(heads * num_classes))
        if self.weight_decays:
            self.register_buffer("rows", torch.arange(1, features + 1).masked_fill(torch.arange(features) == pad_id, 0))
        # each weight column's L2 coefficient; not saved (a chosen, one-head bag regularises nothing itself)
        decay = torch.tensor(self.weight_decays, dtype=torch.float32).repeat_interleave(num_classes)
        self.register_buffer("decay", decay, persistent=False)
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
        return gather(self.char_table, tokens).flatten(1)

    @torch.no_grad()
    def fit_idf(self, tokens: torch.Tensor) -> None:
        """Set idf from the training split's token ids (and from nothing else): ln((1 + n) / (1 + df)) + 1, where df
        counts the texts holding a feature; 0 for the features that no training text holds."""
        tokens = tokens.cpu()
        features = self.idf.numel()
        texts = torch.arange(tokens.size(0)).unsqueeze(1)
        words = tokens != self.pad_id  # a padding token has no character n-grams: only the words' are gathered
        word_ids, char_ids = self.word_ids(tokens), self.char_table[tokens[words]]
        df = torch.zeros(features, dtype=torch.float64)
        for ids, text in ((word_ids, texts.expand_as(word_ids)), (char_ids, texts.expand_as(tokens)[words, None])):
            real = ids != self.pad_id
            pairs = torch.unique((text * features + ids)[real], sorted=False)  # each (text, feature) once
            df += torch.bincount(pairs % features, minlength=features).double()
        n = tokens.size(0)
        idf = torch.where(df > 0, ((1 + n) / (1 + df)).log() + 1, torch.zeros_like(df))  # padding: df 0, idf 0
        self.idf.copy_(idf.float())
        if self.weight_decays:
            self._keep_rows_of_seen_features()

    def _keep_rows_of_seen_features(self) -> None:
        """Candidates, before training: weight rows for the features of the training texts only (idf > 0; the
        others add nothing and learn nothing), as the optimizer's dense work each step scales with the rows (a
        third fewer on the tweets, three quarters on TREC)."""
        seen = self.idf > 0
        self.rows.zero_()[seen] = torch.arange(1, int(seen.sum()) + 1)
        self.weight = nn.Parameter(self.weight.new_zeros(int(seen.sum()) + 1, self.weight.size(1)))

    def normalised_weights(self, ids: torch.Tensor) -> torch.Tensor:
        weights = gather(self.idf, ids)
        if self.training and self.dropout:
            weights = weights * (torch.rand(ids.shape, device=ids.device) >= self.dropout)
        return weights / weights.square().sum(1, keepdim=True).sqrt().clamp(min=1e-12)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.size(1) > self.max_length:
            raise ValueError(f"sequence length {tokens.size(1)} is longer than the model's "
                             f"max_length {self.max_length}")
        words, chars = self.word_ids(tokens), self.char_ids(tokens)
        ids = torch.cat([words, chars], dim=1)
        weights = torch.cat([self.normalised_weights(words), self.normalised_weights(chars)], dim=1)
        weights = weights.to(self.weight.dtype)
        if not self.weight_decays:
            return self.weighted_rows(ids, weights, bag=False) + self.bias
        on_host = self.host_gather_on_cpu and ids.device.type == "cpu"
        logits = self.weighted_rows(gather(self.rows, ids), weights, bag=on_host) + self.bias
        return logits.view(len(logits), -1, self.num_classes)

    def weighted_rows(self, ids: torch.Tensor, weights: torch.Tensor, bag: bool) -> torch.Tensor:
        """sum_j weights[:, j] * weight[ids[:, j]]. index_select + a weighted sum: for one head's narrow rows, its
        backward (index_add) is 2-4x faster on CPU than embedding_bag's, and it replays in a CUDA graph. `bag`:
        embedding_bag over the slots that hold a feature (_HeldRowsBag), which makes no (N, slots, K * C) copy,
        1.5-5x faster on CPU for the K heads' wide rows; it finds those slots on the host (no graph capture), so CPU
        only, and gives `weights` no gradient (the idf weights never want one)."""
        if bag and not weights.requires_grad:
            return _HeldRowsBag.apply(ids, weights, self.weight)
        rows = self.weight.index_select(0, ids.flatten()).view(*ids.shape, -1)
        return (rows * weights.unsqueeze(-1)).sum(1)

    def l2_penalty(self) -> torch.Tensor:
        """A zero to add to the training loss, whose gradient is each head's weight times its weight decay: what
        SGD's weight_decay adds to the gradient, per head, and scaled as the loss is (accumulation, fp16 loss
        scaling). Biases are not decayed, as the engine's optimizer leaves them."""
        if not self.weight_decays:
            return self.weight.new_zeros(())
        return _DecayGradient.apply(self.weight, self.decay)

    @torch.no_grad()
    def select_head(self, head: int) -> TfidfBag:
        """The candidate `head` as a one-head bag with the same statistics and features (config included), on the
        same device: what is saved, evaluated and served."""
        if not 0 <= head < max(1, len(self.weight_decays)):
            raise ValueError(f"head {head} is not one of the {len(self.weight_decays)} candidates")
        chosen = TfidfBag(self.vocab_size, self.num_classes, self.max_length, self.pad_id, self.ngrams,
                          self.buckets, self.char_ngrams, self.char_buckets, self.dropout)
        columns = slice(head * self.num_classes, (head + 1) * self.num_classes)
        chosen.to(self.weight.device)
        # features without a row of their own (row 0) weigh nothing, as in a bag trained alone
        chosen.weight.copy_(self.weight[:, columns][self.rows] * (self.rows > 0).unsqueeze(1))
        chosen.bias.copy_(self.bias[columns])
        chosen.char_table.copy_(self.char_table)
        chosen.idf.copy_(self.idf)
        if hasattr(self, "config"):
            chosen.config = dict(self.config)
        return chosen.to(self.weight.dtype)

    @torch.no_grad()
    def ngram_scores(self, ids: torch.Tensor) -> torch.Tensor:
        """(K,) feature ids -> (K, num_classes): what one occurrence adds to each class's logit, before the norm (a
        one-head bag)."""
        return (self.weight[ids] * self.idf[ids, None]).float()


def build(p, vocab_size: int, num_classes: int, max_length: int, pad_id: int = 0) -> TfidfBag:
    """tfidf_bag for text section `p`: one head per weight decay when `p.weight_decay` is a list of candidates
    (auto: trainlab.core.auto.WEIGHT_DECAY_CANDIDATES), the validation split choosing among them."""
    candidates = p.weight_decay if isinstance(p.weight_decay, tuple) else ()
    model = TfidfBag(vocab_size, num_classes, max_length, pad_id, p.ngrams, p.buckets, p.char_ngrams,
                     p.char_buckets, p.dropout, candidates)
    model.config = {"task": "text", "arch": "tfidf_bag", "ngrams": p.ngrams, "buckets": p.buckets,
                    "char_ngrams": list(p.char_ngrams) if p.char_ngrams else None, "char_buckets": p.char_buckets,
                    "dropout": p.dropout, "vocab_size": vocab_size, "num_classes": num_classes,
                    "max_length": max_length, "pad_id": pad_id}
    return model
