"""The data layer: embedded and user data sources, splits, tokenizer, and the prepared on-disk format."""

from trainlab.data.prepare import prepare_all
from trainlab.data.prepared import SPLITS, load_jsonl, load_meta, load_split, save_meta, save_split
from trainlab.data.tokenizer import Tokenizer

__all__ = ["SPLITS", "Tokenizer", "load_jsonl", "load_meta", "load_split", "prepare_all", "save_meta", "save_split"]
