"""DVC stage `prepare`: build data/prepared (classification, segmentation, text) and the data-statistics metrics."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from trainlab.core.atomic import atomic_dir, write_json
from trainlab.core.cli import command_parser, run_cli
from trainlab.core.config import DEFAULT_PARAMS, Params, load_params
from trainlab.tracking.uri import probe_tracking


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = command_parser(prog="python -m stages.prepare", description=__doc__)
    parser.add_argument("out_dir", type=Path, help="folder for the prepared datasets (replaced whole on success)")
    parser.add_argument("stats_file", type=Path, help="dataset statistics, a DVC metrics file (JSON)")
    parser.add_argument("--params", type=Path, default=DEFAULT_PARAMS, help="params file (default: params.yaml)")
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
    params = load_params(args.params)  # bad params fail here, before torch is imported
    probe_tracking(params)  # an unreachable server too (or its local fallback)
    from trainlab.jobs.prepare import prepare_all
    from trainlab.core.flatten import numbers
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
    run_cli(main)
