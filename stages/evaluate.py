"""DVC stage evaluate: score the three trained models on their test splits; metrics, confusion data and pictures."""

from __future__ import annotations

import argparse
from pathlib import Path

from trainlab.core.cli import run_cli
from trainlab.jobs.stage_cli import stage_params, stage_parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = stage_parser("python -m stages.evaluate", __doc__)
    parser.add_argument("data_dir", type=Path, help="prepared data (classification/, segmentation/, text/)")
    parser.add_argument("models_dir", type=Path, help="trained models (classifier/, segmenter/, text/)")
    parser.add_argument("out_dir", type=Path, help="reports folder, replaced whole on success")
    return parser.parse_args(argv)


def main(argv: list[str]) -> dict:
    args = parse_args(argv)
    params = stage_params(args)  # bad params or an unreachable server fail here, before torch is imported
    from trainlab.jobs.evaluate import describe, run_evaluation

    metrics = run_evaluation(params, args.data_dir, args.models_dir, args.out_dir)
    print(describe(metrics))
    print(f"evaluate: wrote {args.out_dir}")
    return metrics


if __name__ == "__main__":
    run_cli(main, teardown=False)
