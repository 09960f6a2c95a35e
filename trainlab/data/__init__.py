"""The data layer: embedded and user data sources, splits, tokenizer, and the prepared on-disk format."""

# Only the light modules here: training and evaluation read prepared data and must not import the data sources
# (pandas, PIL, tifffile); `prepare_all` lives in trainlab.data.prepare.
from trainlab.data.prepared import SPLITS, load_jsonl, load_meta, load_split, save_meta, save_split
from trainlab.data.tokenizer import Tokenizer

__all__ = ["SPLITS", "Tokenizer", "load_jsonl", "load_meta", "load_split", "save_meta", "save_split"]
