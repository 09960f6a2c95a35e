"""DVC stage text_baseline: fit the TF-IDF + logistic regression bar for the text model once per prepared text data."""

from __future__ import annotations

import argparse
from pathlib import Path

from trainlab.core.cli import run_cli
from trainlab.jobs.stage_cli import stage_params, stage_parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = stage_parser("python -m stages.text_baseline", __doc__)
    parser.add_argument("data_dir", type=Path, help="prepared text data (train.jsonl, test.jsonl, meta.json)")
    parser.add_argument("out_dir", type=Path, help="where baseline.json is written (replaced whole on success)")
    return parser.parse_args(argv)


def main(argv: list[str]) -> dict:
    args = parse_args(argv)
    params = stage_params(args)  # bad params or an unreachable server fail here, before torch is imported
    from trainlab.tasks.text_baseline import write_baseline
    from trainlab.tracking.runs import start_run

    with start_run(params, stage="text_baseline", device="cpu") as tracker:  # scikit-learn, on the CPU; no torch
        tracker.log_params({"text": {k: v for k, v in params.text.model_dump().items() if k.startswith("baseline_")},
                            "base": {"seed": params.base.seed}})
        result = write_baseline(params, args.data_dir, args.out_dir)
        tracker.log_metrics({"test_accuracy": result["accuracy"], "test_macro_f1": result["macro_f1"]})
    print(f"text baseline (TF-IDF + logistic regression): test accuracy {result['accuracy']:.4f}, "
          f"macro-F1 {result['macro_f1']:.4f}; wrote {args.out_dir / 'baseline.json'}")
    return result


if __name__ == "__main__":
    run_cli(main, teardown=False)
