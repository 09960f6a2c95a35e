"""DVC stage text_baseline: fit the TF-IDF + logistic regression bar for the text model once per prepared text data."""

from __future__ import annotations

import argparse
from pathlib import Path

from trainlab.core.cli import command_parser, run_cli
from trainlab.core.config import DEFAULT_PARAMS, load_params
from trainlab.tracking.uri import probe_tracking


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = command_parser(prog="python -m stages.text_baseline", description=__doc__)
    parser.add_argument("data_dir", type=Path, help="prepared text data (train.jsonl, test.jsonl, meta.json)")
    parser.add_argument("out_dir", type=Path, help="where baseline.json is written (replaced whole on success)")
    parser.add_argument("--params", type=Path, default=DEFAULT_PARAMS, help="params file (default: params.yaml)")
    return parser.parse_args(argv)


def main(argv: list[str]) -> dict:
    args = parse_args(argv)
    params = load_params(args.params)
    probe_tracking(params)  # an unreachable server fails now (or its local fallback is taken)
    from trainlab.tasks.text_baseline import write_baseline
    from trainlab.tracking.runs import start_run

    with start_run(params, stage="text_baseline") as tracker:
        tracker.log_params({"text": {k: v for k, v in params.text.model_dump().items() if k.startswith("baseline_")},
                            "base": {"seed": params.base.seed}})
        result = write_baseline(params, args.data_dir, args.out_dir)
        tracker.log_metrics({"test_accuracy": result["accuracy"], "test_macro_f1": result["macro_f1"]})
    print(f"text baseline (TF-IDF + logistic regression): test accuracy {result['accuracy']:.4f}, "
          f"macro-F1 {result['macro_f1']:.4f}; wrote {args.out_dir / 'baseline.json'}")
    return result


if __name__ == "__main__":
    run_cli(main)
