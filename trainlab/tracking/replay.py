"""Log what a stage kept while its MLflow server was away: `python -m trainlab.tracking.replay [SPOOL_DIR]`."""

from __future__ import annotations

from pathlib import Path

from trainlab.core.cli import command_parser, run_cli
from trainlab.core.config import load_params
from trainlab.core.errors import TrackingUnavailable
from trainlab.tracking.spool import SPOOL_ROOT, pending_spools, replay
from trainlab.tracking.uri import configure_http


def main(argv: list[str]) -> int:
    parser = command_parser(prog="python -m trainlab.tracking.replay", description=__doc__)
    parser.add_argument("spool_dir", nargs="?", type=Path, default=SPOOL_ROOT,
                        help=f"where the stages spooled their calls (default: {SPOOL_ROOT})")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"),
                        help="params.yaml whose tracking.request_timeout_s / request_retries bound each request")
    args = parser.parse_args(argv)
    if args.params.is_file():
        tracking = load_params(args.params).tracking
        configure_http(tracking.request_timeout_s, tracking.request_retries)
    else:
        configure_http(10, 1)
    folders = pending_spools(args.spool_dir)
    if not folders:
        print(f"nothing to replay in {args.spool_dir}")
        return 0
    failed: list[TrackingUnavailable] = []
    for folder in folders:
        try:
            run_id, made = replay(folder)
        except TrackingUnavailable as exc:
            failed.append(exc)
            continue
        print(f"{folder}: logged {made} calls; MLflow run {run_id} is complete (the stage's next run takes its "
              "outputs from here without training)")
    if failed:
        raise failed[0] if len(failed) == 1 else TrackingUnavailable(
            f"{len(failed)} of {len(folders)} spools could not be replayed; first: {failed[0]}")
    return 0


if __name__ == "__main__":
    run_cli(main)
