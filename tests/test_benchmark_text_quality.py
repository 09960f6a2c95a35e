"""The text benchmark: corpora from ../shared/data/text (skipped with a reason when absent), figures per model, and
the weight decay the default text model chooses on validation."""

from __future__ import annotations

import pytest

from benchmarks import text_quality
from benchmarks.text_quality import MODELS, SHARED_TEXT, markdown, measure, weight_decay_choice


def test_a_missing_corpus_is_reported_as_skipped_with_its_path(monkeypatch, tmp_path):
    monkeypatch.setitem(text_quality.CORPORA, "nowhere", {"source": "csv", "path": str(tmp_path / "none.csv")})
    results = measure(["nowhere"], {"ngram_bag": {"arch": "ngram_bag"}})
    assert "none.csv not found" in results["nowhere"]["skipped"]
    assert "| nowhere | skipped |" in markdown(results)


@pytest.mark.slow
@pytest.mark.skipif(not (SHARED_TEXT / "trec_questions.csv").is_file(),
                    reason=f"{SHARED_TEXT}/trec_questions.csv is not here (the shared corpora sit beside the checkout)")
def test_trec_questions_through_the_user_data_path():
    # the settings the benchmark documents for ngram_bag (over params.yaml's text section, whose optimizer is sgd)
    results = measure(["trec_questions"], {"ngram_bag": MODELS["ngram_bag"]})
    row = results["trec_questions"]
    assert row["num_classes"] == 6 and row["samples"]["total"] > 5000
    bag = row["models"]["ngram_bag"]
    assert bag["arch"] == "ngram_bag" and bag["accuracy"] > 0.6  # 6 classes: chance is about 0.23
    assert row["baseline"]["accuracy"] > 0.6
    assert bag["over_baseline_points"] == pytest.approx(100 * (bag["accuracy"] - row["baseline"]["accuracy"]))
    assert "| trec_questions | ngram_bag (ngram_bag) |" in markdown(results)


def test_the_weight_decay_choice_reports_a_missing_corpus_as_skipped(monkeypatch, tmp_path):
    monkeypatch.setitem(text_quality.CORPORA, "nowhere", {"source": "csv", "path": str(tmp_path / "none.csv")})
    part = weight_decay_choice(["nowhere"])
    assert part.headline == {} and "| nowhere | skipped |" in part.markdown


@pytest.mark.slow
@pytest.mark.skipif(not (SHARED_TEXT / "trec_questions.csv").is_file(),
                    reason=f"{SHARED_TEXT}/trec_questions.csv is not here (the shared corpora sit beside the checkout)")
def test_the_weight_decay_chosen_on_validation_beats_the_baseline_on_trec():
    from trainlab.models.tfidf_bag import WEIGHT_DECAY_CANDIDATES

    part = weight_decay_choice(["trec_questions"])
    auto = part.data["trec_questions"]["models"]["auto"]
    assert auto["chosen"]["weight_decay"] in WEIGHT_DECAY_CANDIDATES
    assert auto["over_baseline_points"] > 1  # the bar on the corpora of the repo: +1 point
    assert part.headline["text_auto_weight_decay_trec_questions"] == auto["chosen"]["weight_decay"]
    assert f"| trec_questions | {auto['chosen']['weight_decay']:g} |" in part.markdown
