"""What every stage's command line shares: the --params option, and bad params or an unreachable tracking server
reported before torch is imported."""

from __future__ import annotations

import argparse
from pathlib import Path

from trainlab.core.cli import command_parser
from trainlab.core.config import DEFAULT_PARAMS, Params, load_params
from trainlab.tracking.uri import probe_tracking


def stage_parser(prog: str, description: str | None) -> argparse.ArgumentParser:
    """A stage's parser (with --debug, see trainlab.core.cli) that already has --params; the stage adds its paths."""
    parser = command_parser(prog=prog, description=description)
    parser.add_argument("--params", type=Path, default=DEFAULT_PARAMS, help="params file (default: params.yaml)")
    return parser


def stage_params(args: argparse.Namespace, probe: bool = True) -> Params:
    """The validated params of `args.params` (exit 2 on a bad key or value), then, with `probe`, the tracking
    server checked (exit 6 when it cannot be reached, or its local fallback taken): both before any torch import."""
    params = load_params(args.params)
    if probe:
        probe_tracking(params)
    return params
