"""DVC stage `prepare`: build data/prepared (classification, segmentation, text) and the data-statistics metrics."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from trainlab.core.atomic import atomic_dir, write_json
from trainlab.core.cli import run_cli
from trainlab.core.config import Params
from trainlab.jobs.stage_cli import stage_params, stage_parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = stage_parser("python -m stages.prepare", __doc__)
    parser.add_argument("out_dir", type=Path, help="folder for the prepared datasets (replaced whole on success)")
    parser.add_argument("stats_file", type=Path, help="dataset statistics, a DVC metrics file (JSON)")
    parser.add_argument("--download", action="store_true",
                        help="download missing torchvision raw files into data.classification.root (needs internet)")
    return parser.parse_args(argv)


def log(message: str) -> None:
    print(f"prepare: {message}", flush=True)


def run_params(params: Params) -> dict[str, Any]:
    """What prepare reads: the data section and the seed."""
    return {"data": params.data.model_dump(mode="json"), "base": {"seed": params.base.seed}}


def main(argv: list[str]) -> dict[str, Any]:
    args = parse_args(argv)
    params = stage_params(args)  # bad params or an unreachable server fail here, before torch is imported
    from trainlab.core.flatten import numbers
    from trainlab.jobs.prepare import prepare_all
    from trainlab.tracking.runs import start_run

    started = time.perf_counter()
    with start_run(params, stage="prepare") as tracker:
        tracker.log_params(run_params(params))
        with atomic_dir(args.out_dir) as staging:
            stats = prepare_all(params, staging, allow_download=args.download, log=log)
        write_json(args.stats_file, stats)
        seconds = time.perf_counter() - started
        tracker.log_metrics({**numbers(stats, safe_keys=True), "prepare_seconds": round(seconds, 3)})
        tracker.log_dict(stats, "data_stats.json")
    log(f"wrote {args.out_dir} and {args.stats_file} in {seconds:.1f} s")
    return stats


if __name__ == "__main__":
    run_cli(main, teardown=False)
