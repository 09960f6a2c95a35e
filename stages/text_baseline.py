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
    from trainlab.jobs.text_baseline import run

    return run(params, args.data_dir, args.out_dir)


if __name__ == "__main__":
    run_cli(main, teardown=False)
