"""Scheduled retraining: serve the retrain flow on a cron (schedule.cron) or interval, or deploy it to a work pool."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from pipelines.compare import promote_new_models
from pipelines.dag import find_root
from pipelines.flow import DEFAULT_RETRIES, DEFAULT_RETRY_DELAY_S, pipeline
from pipelines.overrides import validated_params
from trainlab.core.cli import command_parser, run_cli
from trainlab.core.config import ScheduleParams
from trainlab.core.errors import ParamsError

DEPLOYMENT_NAME = "trainlab-retrain"
DEFAULT_POOL = "trainlab-process"
ENTRYPOINT = "pipelines/schedule.py:retrain"


@task(name="promote-better-models", cache_policy=NO_CACHE)
def promote_task(root: str, parent_run_id: str | None) -> list[dict[str, Any]]:
    """Compare the models this run trained with the champions; promote only a better one."""
    logger = get_run_logger()
    if not parent_run_id:
        logger.info("tracking is disabled: nothing to compare or promote")
        return []
    decisions = promote_new_models(root, parent_run_id)
    for decision in decisions:
        logger.info(("promoted: " if decision.promoted else "kept: ") + decision.reason)
    return [d.to_dict() for d in decisions]


@flow(name="trainlab-retrain", log_prints=True)
def retrain(root: str | None = None, retries: int = DEFAULT_RETRIES,
            retry_delay_s: float = DEFAULT_RETRY_DELAY_S) -> dict[str, Any]:
    """A retraining job: run the pipeline (DVC skips what is up to date), then promote better models."""
    summary = pipeline(root=root, retries=retries, retry_delay_s=retry_delay_s)
    promotions = promote_task(summary["repo"], summary["mlflow_run_id"])
    return {"pipeline": summary, "promotions": promotions}


def schedule_for(root: Path, cron: str | None, interval: float | None, timezone: str | None) -> Any:
    """A Prefect schedule: `--interval`, else `--cron`, else schedule.cron/timezone from params.yaml."""
    from prefect.schedules import Cron, Interval

    if interval is not None:
        if interval <= 0:
            raise ParamsError(f"--interval: got {interval:g}; give a positive number of seconds")
        return Interval(datetime.timedelta(seconds=interval))
    configured = validated_params(root).schedule
    try:
        schedule = ScheduleParams(cron=cron or configured.cron, timezone=timezone or configured.timezone)
    except Exception as exc:  # pydantic's ValidationError: one line naming the bad value
        raise ParamsError(f"schedule: {_first_error(exc)}") from None
    return Cron(schedule.cron, timezone=schedule.timezone)


def _first_error(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors) and errors():
        err = errors()[0]
        return f"{'.'.join(str(p) for p in err['loc'])}: got {err.get('input')!r}; {err['msg']}"
    return str(exc)


def describe(schedule: Any) -> str:
    if getattr(schedule, "cron", None):
        return f"cron {schedule.cron!r} ({schedule.timezone or 'UTC'})"
    return f"every {schedule.interval.total_seconds():g} s"


def serve(root: Path, schedule: Any, name: str = DEPLOYMENT_NAME) -> None:
    """Serve `retrain` in this process until interrupted; runs appear in the Prefect UI under `name`.

    Schedules need a Prefect server's scheduler (an ephemeral API has none): with no PREFECT_API_URL, a local
    `prefect server start` is reused or started (and stopped on exit). Ctrl+C and SIGTERM stop it quietly."""
    with local_server_unless_configured():
        print(f"serving {name} for {root}: {describe(schedule)}; Ctrl+C stops (and pauses the schedule)", flush=True)
        try:
            retrain.serve(name=name, schedules=[schedule], parameters={"root": str(root)}, pause_on_shutdown=True,
                          limit=1, print_starting_message=False)  # one job at a time: they share DVC's lock
        except KeyboardInterrupt:  # Prefect handles the first one; a second Ctrl+C lands here
            pass
    print(f"stopped serving {name}", flush=True)


@contextlib.contextmanager
def local_server_unless_configured() -> Iterator[None]:
    """Nothing when PREFECT_API_URL names a server; else a local server on 127.0.0.1 for the block."""
    from pipelines.local_prefect import configured_api_url, local_server

    configured = configured_api_url()
    if configured:
        print(f"Prefect API: {configured} (PREFECT_API_URL); its UI shows the runs", flush=True)
        yield
        return
    with local_server(log=lambda line: print(line, flush=True)):
        yield


def ensure_process_pool(pool: str) -> None:
    """Create the work pool (type `process`) if it does not exist yet."""
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(pool)
        except ObjectNotFound:
            client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
            print(f"created work pool {pool!r} (type process)")


def deploy(root: Path, schedule: Any, pool: str, name: str = DEPLOYMENT_NAME) -> Any:
    """Register `retrain` as a deployment of a process work pool; `prefect worker start --pool POOL` runs it."""
    ensure_process_pool(pool)
    source = retrain.from_source(source=str(root), entrypoint=ENTRYPOINT)
    deployment_id = source.deploy(name=name, work_pool_name=pool, schedules=[schedule], concurrency_limit=1,
                                  parameters={"root": str(root)}, build=False, push=False, print_next_steps=False)
    print(f"deployed {name} to work pool {pool!r}: {describe(schedule)}; "
          f"start a worker with `prefect worker start --pool {pool}`")
    return deployment_id


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = command_parser(prog="python -m pipelines.schedule", description=__doc__)
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--cron", help="cron expression (default: schedule.cron in params.yaml)")
    when.add_argument("--interval", type=float, help="run every this many seconds instead of on a cron")
    parser.add_argument("--timezone", help="IANA time zone of the cron (default: schedule.timezone)")
    parser.add_argument("--name", default=DEPLOYMENT_NAME, help=f"deployment name (default {DEPLOYMENT_NAME})")
    parser.add_argument("--pool", nargs="?", const=DEFAULT_POOL, default=None,
                        help=f"deploy to this process work pool (default {DEFAULT_POOL}) instead of serving here")
    parser.add_argument("--print-cron", action="store_true", help="print the configured cron and exit")
    parser.add_argument("--print-timezone", action="store_true", help="print the cron's time zone and exit")
    return parser.parse_args(argv)


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    root = find_root()
    schedule = schedule_for(root, args.cron, args.interval, args.timezone)
    if args.print_cron:
        print(schedule.cron if getattr(schedule, "cron", None) else "")
    elif args.print_timezone:
        print(getattr(schedule, "timezone", None) or "UTC")
    elif args.pool:
        deploy(root, schedule, args.pool, args.name)
    else:
        signal.signal(signal.SIGTERM, _interrupt)  # stop like Ctrl+C until Prefect's runner installs its own handler
        # A process started in the background by a script (`... &` without job control) inherits SIGINT ignored;
        # `kill -INT` and Ctrl+C still stop it, like the stages.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        serve(root, schedule, args.name)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    run_cli(main)
