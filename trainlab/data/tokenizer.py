"""A small word-level tokenizer: documented normalisation, a frequency vocabulary fitted on train texts, JSON on disk.

Normalisation: lowercase (unless ``lowercase=False``); URLs become ``<url>``, @mentions ``<user>``, and a hashtag
``#word`` becomes ``<hashtag> word``. Tokens: the placeholders, words (letters/digits/underscore, with inner
apostrophes such as ``don't``) and single punctuation or symbol characters.
Vocabulary: [PAD]=0, [UNK]=1, [CLS]=2, then the tokens seen at least ``min_frequency`` times in the training
texts, most frequent first, ties broken alphabetically, up to ``vocab_size`` entries in all.
Encoding: [CLS] first, then the token ids, cut to ``max_length``, padded with [PAD]. A token outside the
vocabulary becomes [UNK], or with ``oov_buckets`` > 0 the id ``len(vocab) + crc32(token) % oov_buckets`` (stable
across processes and machines), so rare words still carry a feature of their own most of the time.
``max_length`` auto: the 99th percentile of the training texts' lengths in tokens ([CLS] included), rounded up to a
multiple of 8, at most 512 (`auto_max_length`), so that long documents are read (nearly) whole and short texts
carry little padding.
"""

from __future__ import annotations

import json
import re
import zlib
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch

from trainlab.core import auto
from trainlab.core.atomic import write_json

# max_length auto (its rule and constants): trainlab.core.auto
from trainlab.core.auto import (  # noqa: F401 - re-exported
    AUTO_LENGTH_CAP,
    AUTO_LENGTH_PERCENTILE,
    AUTO_LENGTH_STEP,
    auto_max_length,
)
from trainlab.core.errors import DataError

PAD, UNK, CLS = "[PAD]", "[UNK]", "[CLS]"
SPECIAL_TOKENS = (PAD, UNK, CLS)
PAD_ID, UNK_ID, CLS_ID = 0, 1, 2
FORMAT = "trainlab-word-tokenizer-v1"

URL_RE = re.compile(r"https?://\S+|www\.\S+")
MENTION_RE = re.compile(r"@\w+")
HASHTAG_RE = re.compile(r"#(\w+)")
TOKEN_RE = re.compile(r"<url>|<user>|<hashtag>|\w+(?:'\w+)*|[^\w\s]")



def normalize(text: str, lowercase: bool = True) -> str:
    """Lowercase (optionally) and replace URLs, mentions and hashtags by placeholder tokens."""
    text = URL_RE.sub(" <url> ", text.lower() if lowercase else text)
    text = MENTION_RE.sub(" <user> ", text)
    return HASHTAG_RE.sub(r" <hashtag> \1 ", text)


def split_tokens(text: str, lowercase: bool = True) -> list[str]:
    """The tokens of one text after normalisation."""
    return TOKEN_RE.findall(normalize(text, lowercase))


class Tokenizer:
    """Maps texts to fixed-length id sequences with a frozen vocabulary."""

    def __init__(self, vocab: Sequence[str], max_length: int, lowercase: bool = True, oov_buckets: int = 0):
        if tuple(vocab[:3]) != SPECIAL_TOKENS:
            raise ValueError(f"the vocabulary must start with {SPECIAL_TOKENS}")
        if oov_buckets < 0:
            raise ValueError(f"oov_buckets must be >= 0, got {oov_buckets}")
        if isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer)) or max_length < 1:
            raise ValueError(f"max_length must be a positive integer, got {max_length!r}")
        self.vocab = list(vocab)
        self.max_length, self.lowercase, self.oov_buckets = max_length, lowercase, oov_buckets
        self.ids = {token: i for i, token in enumerate(self.vocab)}
        self.max_length_why: str | None = None  # set by fit when max_length was auto: what it resolved to and why

    @classmethod
    def fit(cls, texts: Iterable[str], vocab_size: int, min_frequency: int, max_length: int | str,
            lowercase: bool = True, oov_buckets: int = 0) -> Tokenizer:
        """Build the vocabulary from (training) texts only; max_length auto is resolved from their lengths
        (trainlab.core.auto.max_length; why in ``max_length_why``)."""
        counts: Counter[str] = Counter()
        lengths = []
        for text in texts:
            tokens = split_tokens(text, lowercase)
            counts.update(tokens)
            lengths.append(len(tokens) + 1)  # [CLS] included, as encode_with_lengths counts
        max_length, why = auto.max_length(max_length, lengths)
        frequent = sorted((t for t, c in counts.items() if c >= min_frequency), key=lambda t: (-counts[t], t))
        tokenizer = cls([*SPECIAL_TOKENS, *frequent[:vocab_size - len(SPECIAL_TOKENS)]], max_length, lowercase,
                        oov_buckets)
        tokenizer.max_length_why = why
        return tokenizer

    @property
    def vocab_size(self) -> int:
        """Ids in use: the vocabulary, then the out-of-vocabulary hash buckets."""
        return len(self.vocab) + self.oov_buckets

    def token_id(self, token: str) -> int:
        known = self.ids.get(token)
        if known is not None:
            return known
        if not self.oov_buckets:
            return UNK_ID
        return len(self.vocab) + zlib.crc32(token.encode("utf-8")) % self.oov_buckets

    def token_ids(self, text: str) -> list[int]:
        """[CLS] and the ids of every token of `text`, not cut to max_length."""
        return [CLS_ID, *(self.token_id(token) for token in split_tokens(text, self.lowercase))]

    def encode_with_lengths(self, texts: Sequence[str]) -> tuple[torch.Tensor, np.ndarray]:
        """Ids (N, max_length) int64 and each text's full length in tokens ([CLS] included) before cutting."""
        tokens = np.full((len(texts), self.max_length), PAD_ID, dtype=np.int64)
        lengths = np.zeros(len(texts), dtype=np.int64)
        for row, text in enumerate(texts):
            ids = self.token_ids(text)
            lengths[row] = len(ids)
            ids = ids[:self.max_length]
            tokens[row, :len(ids)] = ids
        return torch.from_numpy(tokens), lengths

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        """Ids (N, max_length) int64: [CLS] at position 0, [PAD] after the text."""
        return self.encode_with_lengths(texts)[0]

    def to_dict(self) -> dict:
        return {"format": FORMAT, "lowercase": self.lowercase, "max_length": self.max_length, "pad_id": PAD_ID,
                "unk_id": UNK_ID, "cls_id": CLS_ID, "oov_buckets": self.oov_buckets,
                "token_pattern": TOKEN_RE.pattern, "vocab": self.vocab}

    def save(self, path: str | Path) -> None:
        write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """Read a tokenizer saved by `save`; a missing or foreign file is a DataError naming it."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise DataError(f"{path}: tokenizer not found (run `dvc repro prepare` first)") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DataError(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise DataError(f"{path}: not a {FORMAT} tokenizer file")
        return cls(data["vocab"], data["max_length"], data.get("lowercase", True), data.get("oov_buckets", 0))


def token_name(vocab: Sequence[str], i: int) -> str:
    """The vocabulary entry of id `i`, or ``<oov:k>`` for the k-th out-of-vocabulary hash bucket."""
    return vocab[i] if i < len(vocab) else f"<oov:{i - len(vocab)}>"
