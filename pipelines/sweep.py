"""Parameter sweeps: each grid point is a DVC experiment run as a Prefect task, several at a time.

By default the points run in this process's threads; with `--deployment` each point is a flow run of the
`sweep_point` flow deployed to a work pool (pipelines/prefect.yaml), so the pool's workers run them.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.tasks import exponential_backoff

from pipelines import overrides as ov
from pipelines.dag import StageInfo, find_root, read_stages, select
from pipelines.dvc_cli import run_dvc, stage_env
from pipelines.execute import (
    is_transient,
    parse_repro_log,
    read_key_metrics,
    stage_failure,
)
from pipelines.experiment import ExperimentRun, experiment_run
from pipelines.runs import (
    log_summary,
    parent_run,
)
from pipelines.workspace import (
    check_experiment_name,
    new_experiment_name,
    save_experiment,
)
from trainlab.core.cli import command_parser, run_cli
from trainlab.core.errors import ParamsError
from trainlab.core.provenance import git_state

DEFAULT_CONCURRENCY = 2
POINT_RETRIES = 1
POINT_RETRY_DELAY_S = 10.0
POINT_FLOW_NAME = "trainlab-sweep-point"
POOL_POLL_S = 2


@task(name="sweep-point", task_run_name="{name}", cache_policy=NO_CACHE, retries=POINT_RETRIES,
      retry_delay_seconds=exponential_backoff(POINT_RETRY_DELAY_S), retry_condition_fn=is_transient)
def run_point(root: str, name: str, overrides: dict[str, Any], stages: list[StageInfo],
              sweep_run_id: str | None, targets: list[str] | None = None) -> dict[str, Any]:
    """One grid point: `dvc repro [TARGETS]` in a private workspace with the overrides, saved as `dvc exp` NAME.

    One `dvc repro` per point (DVC decides stage by stage); what each stage did is read off its log."""
    logger = get_run_logger()
    started = time.perf_counter()
    repo = Path(root)
    params = ov.validated_params(repo, overrides)
    with experiment_run(repo, params, overrides, name, stages, f"sweep point {name}", "experiment", logger.info,
                        parent_run_id=sweep_run_id) as run:
        point = repro_and_save(run, repo, name, overrides, stages, targets, logger.info, started)
        log_summary(run.tracker, point)
    return point


def repro_and_save(run: ExperimentRun, repo: Path, name: str, overrides: dict[str, Any], stages: list[StageInfo],
                   targets: list[str] | None, log: Callable[[str], None], started: float) -> dict[str, Any]:
    """`dvc repro [TARGETS]` in the experiment's workspace (StageFailed if a stage fails), its stages' key metrics,
    saved as `dvc exp` NAME: a sweep point's or a search trial's body."""
    result = run_dvc(["repro", *(targets or [])], run.workspace, stage_env(run.env), on_line=log)
    if result.returncode != 0:
        raise stage_failure(_failed_stage(result.lines), result)
    statuses = dict(parse_repro_log(result.lines))
    selected = select(stages, targets)
    metrics = {s.name: read_key_metrics(s, run.workspace) for s in selected}
    ref = save_experiment(repo, run.workspace, name, selected, log=log, partial=bool(targets))
    return {"name": name, "overrides": overrides, "experiment_ref": ref,
            "mlflow_run_id": run.tracker.run_id or None, "seconds": round(time.perf_counter() - started, 3),
            "stages": [{"stage": s.name, "status": statuses.get(s.name, "skipped"), "seconds": 0.0,
                        "metrics": metrics[s.name]} for s in selected]}


@flow(name=POINT_FLOW_NAME, persist_result=True, log_prints=True)
def sweep_point(name: str, overrides: dict[str, Any], targets: list[str] | None = None,
                sweep_run_id: str | None = None, root: str | None = None) -> dict[str, Any]:
    """One grid point as a flow run of its own: what a work pool's worker runs for `sweep --deployment`.
    `root` defaults to the checkout the worker runs in (the deployment's working directory)."""
    repo = find_root(root)
    return run_point(str(repo), name, overrides, read_stages(repo), sweep_run_id, targets)


@task(name="sweep-point-on-pool", task_run_name="{name}", cache_policy=NO_CACHE)
def dispatch_point(deployment: str, name: str, overrides: dict[str, Any], targets: list[str] | None,
                   sweep_run_id: str | None) -> dict[str, Any]:
    """Run one point as a flow run of `deployment` (a worker picks it up) and return its summary."""
    from prefect.deployments import run_deployment

    parameters = {"name": name, "overrides": overrides, "targets": targets, "sweep_run_id": sweep_run_id}
    flow_run = run_deployment(deployment, parameters=parameters, flow_run_name=name, timeout=None,
                              poll_interval=POOL_POLL_S)
    state = flow_run.state
    if state is None or not state.is_completed():
        kind = state.type.value if state else "UNKNOWN"
        raise RuntimeError(f"sweep point {name}: flow run {flow_run.name} of {deployment} ended {kind}: "
                           f"{state.message if state else 'no state'} (see the worker's log)")
    return state.result()


def _failed_stage(lines: list[str]) -> str:
    for line in reversed(lines):
        if "failed to reproduce '" in line:
            return line.split("failed to reproduce '", 1)[1].split("'", 1)[0]
    return "pipeline"


def point_names(prefix: str, count: int) -> list[str]:
    return [f"{prefix}-{i:02d}" for i in range(1, count + 1)]


def check_points(repo: Path, points: list[dict[str, Any]], names: list[str]) -> None:
    """Every point's params valid and every experiment name free, before anything runs."""
    for point in points:
        ov.validated_params(repo, point)
    for name in names:
        check_experiment_name(repo, name)


@flow(name="trainlab-sweep", log_prints=True)
def sweep(grid: dict[str, list[Any]], concurrency: int = DEFAULT_CONCURRENCY, name: str | None = None,
          targets: list[str] | None = None, root: str | None = None,
          deployment: str | None = None) -> dict[str, Any]:
    """Run every point of `grid` as a DVC experiment, `concurrency` at a time; one MLflow run per point.
    `targets` limits each point to those stages and what they depend on. `deployment` ("flow/deployment" of
    `sweep_point` on a work pool) sends the points to that pool's workers instead of this process's threads."""
    if concurrency < 1:
        raise ParamsError(f"concurrency: got {concurrency}; give 1 or more")
    started = time.perf_counter()
    repo = find_root(root)
    points = ov.expand_grid(grid)
    prefix = name or new_experiment_name("sweep")
    names = point_names(prefix, len(points))
    check_points(repo, points, names)
    stages = read_stages(repo)
    select(stages, targets)  # unknown targets fail here
    if deployment:
        check_deployment(deployment)
    params = ov.validated_params(repo)
    tags = {**git_state(str(repo)), "sweep": prefix, "grid": json.dumps(grid)}
    with parent_run(params, repo, f"sweep {prefix}", "sweep", tags) as tracker:
        results, errors = run_points(repo, points, names, stages, targets, tracker.run_id, concurrency, deployment)
        summary = {"sweep": prefix, "ok": not errors, "grid": grid, "concurrency": concurrency,
                   "deployment": deployment,
                   "mlflow_run_id": tracker.run_id or None, "seconds": round(time.perf_counter() - started, 3),
                   "points": results}
        get_run_logger().info("sweep %s\n%s", prefix, sweep_table(summary))
        if tracker.run_id:
            tracker.log_dict(summary, "sweep_summary.json")
        if errors:
            raise errors[0]
    return summary


def check_deployment(deployment: str) -> None:
    """The points' deployment exists on the Prefect server (checked before any point starts)."""
    from prefect import get_client
    from prefect.exceptions import ObjectNotFound

    if deployment.count("/") != 1 or not all(deployment.split("/")):
        raise ParamsError(f"--deployment {deployment!r}: give it as FLOW/DEPLOYMENT, "
                          f"e.g. {POINT_FLOW_NAME}/sweep-point")
    try:
        with get_client(sync_client=True) as client:
            client.read_deployment_by_name(deployment)
    except ObjectNotFound:
        raise ParamsError(f"--deployment {deployment!r} is not on the Prefect server; deploy it with `prefect deploy "
                          "--prefect-file pipelines/prefect.yaml --name sweep-point` and start a worker on its pool "
                          "(see docs/orchestration.md#sweeps)") from None


def run_points(repo: Path, points: list[dict[str, Any]], names: list[str], stages: list[StageInfo],
               targets: list[str] | None, sweep_run_id: str | None, concurrency: int,
               deployment: str | None = None) -> tuple[list[dict[str, Any]], list[BaseException]]:
    """Submit every point, `concurrency` at a time (run here, or dispatched to `deployment`), and wait for all."""
    with ThreadPoolTaskRunner(max_workers=concurrency) as runner:
        if deployment:
            futures = [runner.submit(dispatch_point, parameters={"deployment": deployment, "name": n, "overrides": p,
                                                                 "targets": targets, "sweep_run_id": sweep_run_id})
                       for n, p in zip(names, points)]
        else:
            futures = [runner.submit(run_point, parameters={"root": str(repo), "name": n, "overrides": p,
                                                            "stages": stages, "sweep_run_id": sweep_run_id,
                                                            "targets": targets})
                       for n, p in zip(names, points)]
        states = [f.wait() or f.state for f in futures]
    results, errors = [], []
    for n, p, state in zip(names, points, states):
        if state.is_completed():
            results.append(state.result())
        else:
            error = state.result(raise_on_failure=False)
            errors.append(error if isinstance(error, BaseException) else RuntimeError(str(state.message)))
            results.append({"name": n, "overrides": p, "error": str(errors[-1]), "stages": []})
    return results, errors


def sweep_table(summary: dict[str, Any]) -> str:
    """One line per point: experiment, overrides, outcome, headline metrics."""
    lines = []
    for point in summary["points"]:
        metrics = {k: v for s in point.get("stages", []) if s["status"] in ("ran", "restored")
                   for k, v in s["metrics"].items()}
        shown = ", ".join(f"{k}={v:.4g}" for k, v in list(metrics.items())[:4])
        outcome = f"failed: {point['error']}" if "error" in point else (shown or "all stages up to date")
        lines.append(f"{point['name']}  {ov.describe(point['overrides'])}  {outcome}")
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = command_parser(prog="python -m pipelines.sweep", description=__doc__)
    parser.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...", required=True,
                        help="values of one param (repeatable; the sweep runs every combination)")
    parser.add_argument("--concurrency", "-j", type=int, default=DEFAULT_CONCURRENCY,
                        help=f"experiments at a time (default {DEFAULT_CONCURRENCY})")
    parser.add_argument("--name", help="experiment name prefix (default sweep-<time>-<id>); points are PREFIX-01, ...")
    parser.add_argument("--target", action="append", default=[],
                        help="run only this stage and what it needs in each point (repeatable)")
    parser.add_argument("--deployment", metavar="FLOW/DEPLOYMENT",
                        help=f"run the points on a work pool: the deployment of {POINT_FLOW_NAME} to use, e.g. "
                             f"{POINT_FLOW_NAME}/sweep-point from pipelines/prefect.yaml (its workers run them)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    return parser.parse_args(argv)


def main(argv: list[str]) -> dict[str, Any]:
    args = parse_args(argv)
    grid = ov.parse_grid(args.grid)
    repo = find_root()
    for point in ov.expand_grid(grid):
        ov.validated_params(repo, point)  # one clear line for a bad value, before Prefect starts
    summary = sweep(grid=grid, concurrency=args.concurrency, name=args.name, targets=args.target or None,
                    deployment=args.deployment)
    print(json.dumps(summary, indent=2) if args.json else sweep_table(summary))
    print("see them with `dvc exp show` and in the MLflow UI (nested under the sweep run)")
    return summary


if __name__ == "__main__":
    run_cli(main)
