"""Text models against their TF-IDF baseline: accuracy, macro-F1 and training time on the tweets and two corpora.

    python -m benchmarks --only text_quality            # every model on every corpus
    python -m benchmarks.text_quality --models ngram_bag --corpora trec_questions   # a quick look at one pair

The corpora other than the embedded tweets are read from ../shared/data/text/ (see its README); a corpus that is
not there is reported as skipped. Each corpus goes through the user-data path (data.text.source csv), is prepared
into a temporary folder with the pipeline's split, and every model trains with the pipeline's engine.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, TRANSFORMER_TEXT, PartResult, log, quiet_stderr, table

SHARED_TEXT = REPO.parent / "shared" / "data" / "text"
# corpus -> data.text overrides (None: the embedded tweets)
CORPORA: dict[str, dict[str, Any] | None] = {
    "tweets": None,
    "movie_reviews": {"source": "csv", "path": str(SHARED_TEXT / "movie_reviews.csv")},
    "trec_questions": {"source": "csv", "path": str(SHARED_TEXT / "trec_questions.csv")},
}
# model -> text.* overrides on top of params.yaml (empty: the default text model as configured)
MODELS: dict[str, dict[str, Any]] = {
    "default": {},
    # each model with the settings params.yaml and docs/data.md give for it (a bag's lr is far too large for the
    # Transformer and the Transformer's far too small for a bag)
    # the default before text.weight_decay auto: one weight decay fixed on the tweets and the two corpora
    "tfidf_bag_fixed": {"arch": "tfidf_bag", "optimizer": "sgd", "lr": 3.0, "weight_decay": 0.00002, "epochs": 10,
                        "batch_size": 128, "dropout": 0.0, "warmup_epochs": 0, "char_ngrams": [3, 5]},
    "ngram_bag": {"arch": "ngram_bag", "optimizer": "adamw", "d_model": 32, "lr": 0.05, "batch_size": 256,
                  "epochs": 3},
    "nb_bag": {"arch": "nb_bag", "optimizer": "adamw", "lr": 0.2, "batch_size": 128, "epochs": 5, "dropout": 0.5,
               "label_smoothing": 0.1, "weight_decay": 0.0, "warmup_epochs": 0},
    "transformer": TRANSFORMER_TEXT,
}


def corpus_missing(corpus: str) -> str | None:
    """Why a corpus cannot be read here, or None."""
    data = CORPORA[corpus]
    if data is not None and not Path(data["path"]).is_file():
        return f"{data['path']} not found (the shared text corpora are not beside this checkout)"
    return None


def load_base_params(overrides: dict[str, Any]):
    from trainlab.core.config import load_params

    return load_params(REPO / "params.yaml", {"tracking.enabled": False, "base.device": "cpu", **overrides})


def prepare(corpus: str, folder: Path, params) -> dict[str, Any]:
    """The corpus prepared like the pipeline's text data (tokenizer from data.text) into `folder`."""
    from trainlab.jobs.prepare import prepare_text

    return prepare_text(params, folder, log=lambda line: None)


def train_and_test(params, folder: Path) -> dict[str, Any]:
    """Fit the text model of `params` on the prepared folder (no checkpoint, no tracking); test metrics and time."""
    from trainlab.core.auto import resolve_training
    from trainlab.core.repro import seed_everything
    from trainlab.core.runtime import resolve_runtime
    from trainlab.data.prepared import load_meta, load_split
    from trainlab.engine.batches import num_samples
    from trainlab.engine.loop import FitOptions, evaluate, fit, scalars
    from trainlab.jobs.train import build_trainable
    from trainlab.tasks import get

    meta = load_meta(folder)
    splits = {s: load_split(folder, s) for s in ("train", "val", "test")}
    runtime = resolve_runtime(params.base)
    seed_everything(params.base.seed)
    t0 = time.perf_counter()
    task = build_trainable("text", params, meta, splits["train"], folder)  # with the statistics of the training split
    statistics_s = time.perf_counter() - t0
    cfg, _ = resolve_training("text", params.text, meta, num_samples(splits["train"]))  # as the stage
    with quiet_stderr():
        result = fit(task, splits["train"], splits["val"], cfg, runtime, params.base.seed,
                     options=FitOptions(eval_batch_size=2 * cfg.batch_size))
    task, chosen = get("text").load().choose_model(task, result)  # as the training stage does
    test = scalars(evaluate(task, result.model, splits["test"], runtime, 2 * cfg.batch_size))
    return {"accuracy": test["accuracy"], "macro_f1": test["macro_f1"],
            "train_time_s": statistics_s + result.train_time_s,
            "epochs": len(result.history), "best_val_accuracy": max(r["val_accuracy"] for r in result.history),
            "val_accuracy": result.history[-1]["val_accuracy"], "params": result.params_total, "chosen": chosen}


def baseline(params, folder: Path, num_classes: int) -> dict[str, Any]:
    from trainlab.jobs.text_baseline import tfidf_baseline

    t0 = time.perf_counter()
    result = tfidf_baseline(folder, params.text.baseline_max_features, params.text.baseline_C, params.base.seed,
                            num_classes)
    return {"accuracy": result["accuracy"], "macro_f1": result["macro_f1"], "fit_time_s": time.perf_counter() - t0}


def measure(corpora: list[str], models: dict[str, dict[str, Any]], data_overrides: dict[str, Any] | None = None,
            ) -> dict[str, Any]:
    """Per corpus: its sizes, the TF-IDF baseline and each model's test figures (or why it was skipped)."""
    out: dict[str, Any] = {}
    for corpus in corpora:
        why = corpus_missing(corpus)
        if why:
            log(f"text_quality {corpus}: skipped ({why})")
            out[corpus] = {"skipped": why}
            continue
        data = {f"data.text.{k}": v for k, v in {**(CORPORA[corpus] or {}), **(data_overrides or {})}.items()}
        with tempfile.TemporaryDirectory(prefix=f"text-{corpus}-") as tmp:
            folder = Path(tmp)
            params = load_base_params(data)
            stats = prepare(corpus, folder, params)
            bar = baseline(params, folder, stats["num_classes"])
            log(f"text_quality {corpus}: {stats['samples']} texts, {stats['num_classes']} classes; TF-IDF baseline "
                f"{bar['accuracy']:.4f}")
            row: dict[str, Any] = {"samples": stats["samples"], "num_classes": stats["num_classes"],
                                   "baseline": bar, "models": {}}
            for name, overrides in models.items():
                model_params = load_base_params({**data, **{f"text.{k}": v for k, v in overrides.items()}})
                figures = train_and_test(model_params, folder)
                figures["arch"] = model_params.text.arch
                figures["over_baseline_points"] = 100 * (figures["accuracy"] - bar["accuracy"])
                row["models"][name] = figures
                log(f"text_quality {corpus} {name} ({figures['arch']}): accuracy {figures['accuracy']:.4f} "
                    f"({figures['over_baseline_points']:+.2f} pt), macro-F1 {figures['macro_f1']:.4f}, "
                    f"{figures['train_time_s']:.1f} s")
            out[corpus] = row
    return out


def markdown(results: dict[str, Any]) -> str:
    rows = []
    for corpus, row in results.items():
        if "skipped" in row:
            rows.append([corpus, "skipped", row["skipped"], "", "", "", ""])
            continue
        bar = row["baseline"]
        for name, m in row["models"].items():
            rows.append([corpus, f"{name} ({m['arch']})", f"{100 * m['accuracy']:.2f}", f"{100 * m['macro_f1']:.2f}",
                         f"{100 * bar['accuracy']:.2f} / {100 * bar['macro_f1']:.2f}",
                         f"{m['over_baseline_points']:+.2f}", f"{m['train_time_s']:.1f}"])
    return "\n".join(["## text_quality", "",
                      "Test split of each corpus (the pipeline's stratified split of data.text); TF-IDF + logistic "
                      "regression on the same split; training time without the baseline.", "",
                      table(["corpus", "model", "accuracy %", "macro-F1 %", "TF-IDF acc / F1 %", "vs TF-IDF (pt)",
                             "train s"], rows)])


def run(quick: bool = False, models: list[str] | None = None, corpora: list[str] | None = None) -> PartResult:
    t0 = time.perf_counter()
    chosen = {m: MODELS[m] for m in (models or (["default"] if quick else list(MODELS)))}
    results = measure(corpora or list(CORPORA), chosen)
    headline = {}
    for corpus, row in results.items():
        if "default" in row.get("models", {}):
            headline[f"text_default_over_tfidf_points_{corpus}"] = row["models"]["default"]["over_baseline_points"]
            headline[f"text_default_train_s_{corpus}"] = row["models"]["default"]["train_time_s"]
    return PartResult("text_quality", results, markdown(results), headline, time.perf_counter() - t0)


def weight_decay_choice(corpora: list[str] | None = None) -> PartResult:
    """The text half of ``python -m benchmarks --only search``: on every corpus here, the default text model
    (text.weight_decay auto: the weight decay chosen on the validation split) and the same bag with the one weight
    decay fixed before, against the TF-IDF baseline; the decay each corpus chose and every candidate's validation
    accuracy."""
    t0 = time.perf_counter()
    models = {"auto": {"weight_decay": "auto"}, "fixed": MODELS["tfidf_bag_fixed"]}
    results = measure(corpora or list(CORPORA), models)
    headline = {}
    for corpus, row in results.items():
        if "skipped" not in row:
            headline[f"text_auto_over_tfidf_points_{corpus}"] = row["models"]["auto"]["over_baseline_points"]
            headline[f"text_auto_weight_decay_{corpus}"] = row["models"]["auto"]["chosen"]["weight_decay"]
    return PartResult("text_weight_decay", results, choice_markdown(results), headline, time.perf_counter() - t0)


def choice_markdown(results: dict[str, Any]) -> str:
    rows = []
    for corpus, row in results.items():
        if "skipped" in row:
            rows.append([corpus, "skipped", row["skipped"], "", "", "", "", ""])
            continue
        auto, fixed = row["models"]["auto"], row["models"]["fixed"]
        candidates = auto["chosen"]["candidates"]
        rows.append([corpus, f"{auto['chosen']['weight_decay']:g}",
                     ", ".join(f"{d}: {c['val_loss']:.4f} / {100 * c['val_accuracy']:.1f}"
                               for d, c in candidates.items()),
                     f"{100 * auto['accuracy']:.2f}", f"{100 * fixed['accuracy']:.2f}",
                     f"{100 * row['baseline']['accuracy']:.2f}", f"{auto['over_baseline_points']:+.2f}",
                     f"{auto['train_time_s']:.1f} / {fixed['train_time_s']:.1f}"])
    return "\n".join(["## text: weight decay chosen on validation", "",
                      "text.weight_decay auto trains one head per candidate weight decay in one run and keeps the "
                      "head with the lowest validation loss (cross-entropy); test accuracy of that head, of the bag "
                      "with weight_decay 2e-5 fixed (the default before), and of the TF-IDF baseline, on each "
                      "corpus's test split.", "",
                      table(["corpus", "chosen", "per candidate: val loss / val accuracy %", "auto %", "fixed 2e-5 %",
                             "TF-IDF %", "auto vs TF-IDF (pt)", "train s auto / fixed"], rows)])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.text_quality", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated: {', '.join(MODELS)}")
    parser.add_argument("--corpora", default=",".join(CORPORA), help=f"comma-separated: {', '.join(CORPORA)}")
    parser.add_argument("--set", action="append", default=[], metavar="text.KEY=VALUE",
                        help="override a text.* or data.text.* param of every model (YAML value), repeatable")
    args = parser.parse_args(argv)
    import yaml

    models = {m: dict(MODELS[m]) for m in args.models.split(",")}
    data_overrides = {}
    for item in args.set:
        key, _, value = item.partition("=")
        if key.startswith("data.text."):
            data_overrides[key.removeprefix("data.text.")] = yaml.safe_load(value)
        else:
            for m in models.values():
                m[key.removeprefix("text.")] = yaml.safe_load(value)
    results = measure(args.corpora.split(","), models, data_overrides)
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
