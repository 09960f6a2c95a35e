"""DVC stage `prepare`: build data/prepared (classification, segmentation, text) and the data statistics."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from trainlab.core.cli import run_cli
from trainlab.jobs.stage_cli import stage_params, stage_parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = stage_parser("python -m stages.prepare", __doc__)
    parser.add_argument("out_dir", type=Path, help="folder for the prepared datasets (replaced whole on success)")
    parser.add_argument("stats_file", type=Path, help="dataset statistics (JSON): per-split counts, sizes, autos")
    parser.add_argument("--download", action="store_true",
                        help="download missing torchvision raw files into data.classification.root (needs internet)")
    return parser.parse_args(argv)


def main(argv: list[str]) -> dict[str, Any]:
    args = parse_args(argv)
    params = stage_params(args)  # bad params or an unreachable server fail here, before torch is imported
    from trainlab.jobs.prepare import run

    return run(params, args.out_dir, args.stats_file, allow_download=args.download)


if __name__ == "__main__":
    run_cli(main, teardown=False)
