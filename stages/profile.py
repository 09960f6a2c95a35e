"""DVC stage `profile`: throughput, FLOPs, MFU, memory and traces of the trained models (reports/profile/)."""

from __future__ import annotations

import argparse
from pathlib import Path

from trainlab.core.cli import run_cli
from trainlab.jobs.stage_cli import stage_params, stage_parser
from trainlab.tasks import names


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = stage_parser("python -m stages.profile", __doc__)
    parser.add_argument("data_dir", type=Path, help="prepared data root (classification/, segmentation/, text/)")
    parser.add_argument("models_dir", type=Path, help="trained models root (classifier/, segmenter/, text/)")
    parser.add_argument("out_dir", type=Path, help="where the profile is written (replaced whole on success)")
    parser.add_argument("--tasks", default=",".join(names()),
                        help=f"comma-separated models to profile (default: {','.join(names())})")
    args = parser.parse_args(argv)
    args.tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = sorted(set(args.tasks) - set(names()))
    if unknown or not args.tasks:
        parser.error(f"--tasks: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(names())}")
    return args


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    params = stage_params(args)  # bad params or an unreachable server fail here, before torch is imported
    from trainlab.jobs.profile import profile_models

    profile_models(params, args.data_dir, args.models_dir, args.out_dir, tasks=args.tasks)


if __name__ == "__main__":
    run_cli(main, teardown=False)
