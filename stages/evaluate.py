"""DVC stage evaluate: score the three trained models on their test splits; metrics, confusion data and pictures."""

from __future__ import annotations

import argparse
from pathlib import Path

from trainlab.core.cli import command_parser, run_cli
from trainlab.core.config import DEFAULT_PARAMS, load_params
from trainlab.tracking.uri import probe_tracking


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = command_parser(prog="python -m stages.evaluate", description=__doc__)
    parser.add_argument("data_dir", type=Path, help="prepared data (classification/, segmentation/, text/)")
    parser.add_argument("models_dir", type=Path, help="trained models (classifier/, segmenter/, text/)")
    parser.add_argument("out_dir", type=Path, help="reports folder, replaced whole on success")
    parser.add_argument("--params", type=Path, default=DEFAULT_PARAMS, help="params file (default: params.yaml)")
    return parser.parse_args(argv)


def main(argv: list[str]) -> dict:
    args = parse_args(argv)
    params = load_params(args.params)  # bad params fail here, before torch is imported
    probe_tracking(params)  # an unreachable server too (or its local fallback)
    from trainlab.jobs.evaluate import describe, run_evaluation

    metrics = run_evaluation(params, args.data_dir, args.models_dir, args.out_dir)
    print(describe(metrics))
    print(f"evaluate: wrote {args.out_dir}")
    return metrics


if __name__ == "__main__":
    run_cli(main)
