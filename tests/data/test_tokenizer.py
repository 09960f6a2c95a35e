"""The word-level tokenizer: normalisation, vocabulary from train texts, [CLS] first, padding, JSON round trip."""

import pytest
import torch

from trainlab.core.errors import DataError
from trainlab.data.tokenizer import (
    AUTO_LENGTH_CAP,
    CLS_ID,
    PAD_ID,
    UNK_ID,
    Tokenizer,
    auto_max_length,
    split_tokens,
    token_name,
)


def test_normalises_urls_mentions_and_hashtags():
    tokens = split_tokens("RT @Bob: I don't LOVE it! #Great http://t.co/x1")
    assert tokens == ["rt", "<user>", ":", "i", "don't", "love", "it", "!", "<hashtag>", "great", "<url>"]


def test_vocabulary_starts_with_specials_then_frequency_then_alphabet():
    tok = Tokenizer.fit(["b a", "a c", "b a d"], vocab_size=16, min_frequency=1, max_length=8)
    assert tok.vocab == ["[PAD]", "[UNK]", "[CLS]", "a", "b", "c", "d"]


def test_min_frequency_and_vocab_size_limit_the_vocabulary():
    texts = ["a a a b b c", "d"]
    assert Tokenizer.fit(texts, vocab_size=16, min_frequency=2, max_length=4).vocab[3:] == ["a", "b"]
    assert Tokenizer.fit(texts, vocab_size=4, min_frequency=1, max_length=4).vocab[3:] == ["a"]


def test_encode_puts_cls_first_pads_and_truncates():
    tok = Tokenizer.fit(["one two three"], vocab_size=16, min_frequency=1, max_length=4)
    ids, lengths = tok.encode_with_lengths(["one", "one two three four", "unseen"])
    assert ids.dtype == torch.int64 and ids.shape == (3, 4)
    assert ids[:, 0].tolist() == [CLS_ID] * 3
    assert ids[0, 2:].tolist() == [PAD_ID, PAD_ID]
    assert ids[1].tolist() == [CLS_ID, tok.ids["one"], tok.ids["two"], tok.ids["three"]]
    assert ids[2, 1].item() == UNK_ID
    assert lengths.tolist() == [2, 5, 2]


def test_save_and_load_round_trip(tmp_path):
    tok = Tokenizer.fit(["hello world", "hello there"], vocab_size=16, min_frequency=1, max_length=6)
    tok.save(tmp_path / "tok.json")
    loaded = Tokenizer.load(tmp_path / "tok.json")
    assert loaded.vocab == tok.vocab and loaded.max_length == 6
    assert torch.equal(loaded.encode(["hello you"]), tok.encode(["hello you"]))


def test_loading_a_missing_or_foreign_file_names_it(tmp_path):
    with pytest.raises(DataError, match="nope.json: tokenizer not found"):
        Tokenizer.load(tmp_path / "nope.json")
    (tmp_path / "other.json").write_text('{"vocab": []}')
    with pytest.raises(DataError, match="other.json: not a"):
        Tokenizer.load(tmp_path / "other.json")


def test_lowercase_false_keeps_case_apart():
    tok = Tokenizer.fit(["Good good GOOD"], vocab_size=16, min_frequency=1, max_length=8, lowercase=False)
    assert set(tok.vocab[3:]) == {"Good", "good", "GOOD"}
    assert Tokenizer.fit(["Good good GOOD"], 16, 1, 8).vocab[3:] == ["good"]


def test_oov_buckets_hash_unknown_words_stably_after_the_vocabulary():
    tok = Tokenizer.fit(["seen words"], vocab_size=16, min_frequency=1, max_length=8, oov_buckets=1000)
    assert tok.vocab_size == len(tok.vocab) + 1000
    ids = tok.encode(["seen zebra quokka zebra"])[0].tolist()
    known, zebra, quokka, zebra_again = ids[1:5]
    assert known == tok.ids["seen"]
    assert zebra == zebra_again and zebra != quokka  # crc32 of these two differs mod 1000
    assert all(len(tok.vocab) <= i < tok.vocab_size for i in (zebra, quokka))
    assert token_name(tok.vocab, zebra) == f"<oov:{zebra - len(tok.vocab)}>"
    without = Tokenizer.fit(["seen words"], 16, 1, 8)
    assert without.encode(["zebra"])[0, 1] == UNK_ID


def test_options_survive_the_json_round_trip(tmp_path):
    tok = Tokenizer.fit(["A b"], vocab_size=16, min_frequency=1, max_length=8, lowercase=False, oov_buckets=7)
    tok.save(tmp_path / "tok.json")
    again = Tokenizer.load(tmp_path / "tok.json")
    assert (again.lowercase, again.oov_buckets, again.vocab) == (False, 7, tok.vocab)
    assert torch.equal(again.encode(["A b C"]), tok.encode(["A b C"]))


# data.text.max_length auto ---------------------------------------------------------------------------------------

def test_auto_max_length_is_the_99th_percentile_rounded_up_to_a_multiple_of_8():
    lengths = [10] * 199 + [37]  # the 99th percentile (method "higher": a length some text has) is 10
    assert auto_max_length(lengths)[0] == 16
    value, why = auto_max_length([21] * 90 + [37] * 10)
    assert value == 40
    assert "99% of the 100 training texts have at most 37 tokens" in why and "multiple of 8" in why
    assert "0.0% of them are cut" in why
    assert auto_max_length([2, 3, 3])[0] == 8


def test_auto_max_length_is_capped_and_says_so():
    value, why = auto_max_length([400] * 50 + [900] * 50)
    assert value == AUTO_LENGTH_CAP == 512
    assert f"above the cap of {AUTO_LENGTH_CAP}" in why and "50.0% of them are cut" in why


def test_fit_resolves_auto_from_the_training_texts_and_says_why():
    texts = [" ".join(["w"] * n) for n in [5] * 60 + [20] * 40]  # 6 and 21 tokens with [CLS]
    tok = Tokenizer.fit(texts, vocab_size=16, min_frequency=1, max_length="auto")
    assert tok.max_length == 24 and "at most 21 tokens" in tok.max_length_why
    assert tok.encode(texts).shape == (100, 24)
    fixed = Tokenizer.fit(texts, vocab_size=16, min_frequency=1, max_length=12)
    assert fixed.max_length == 12 and fixed.max_length_why is None


def test_a_tokenizer_takes_a_resolved_max_length_only():
    with pytest.raises(ValueError, match="max_length must be a positive integer, got 'auto'"):
        Tokenizer(["[PAD]", "[UNK]", "[CLS]"], "auto")
