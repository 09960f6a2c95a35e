"""The pipeline flow: each stage of dvc.yaml is a Prefect task run through DVC, under one MLflow parent run."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.tasks import exponential_backoff

from pipelines import overrides as ov
from pipelines.dag import StageInfo, find_root, read_stages, select
from pipelines.dvc_cli import stage_env
from pipelines.execute import StageOutcome, execute_stage, is_transient
from pipelines.experiment import experiment_run
from pipelines.runs import child_runs, log_summary
from pipelines.workspace import check_experiment_name, new_experiment_name, save_experiment
from trainlab.core.cli import command_parser, run_cli

DEFAULT_RETRIES = 2
DEFAULT_RETRY_DELAY_S = 10.0
RETRY_JITTER = 0.2


@task(name="dvc-stage", task_run_name="{stage.name}", cache_policy=NO_CACHE, retries=DEFAULT_RETRIES,
      retry_delay_seconds=exponential_backoff(DEFAULT_RETRY_DELAY_S), retry_jitter_factor=RETRY_JITTER,
      retry_condition_fn=is_transient)
def run_stage(stage: StageInfo, workspace: str, extra_env: dict[str, str]) -> dict[str, Any]:
    """One DVC stage: skipped when `dvc status` finds it up to date, else `dvc repro --single-item`."""
    logger = get_run_logger()
    return execute_stage(stage, workspace, stage_env(extra_env), log=logger.info).to_dict()


@task(name="save-dvc-experiment", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=2)
def save_experiment_task(root: str, workspace: str, name: str, stages: list[StageInfo], partial: bool) -> str:
    """Record the experiment workspace as `dvc exp` NAME in the main repo."""
    return save_experiment(Path(root), Path(workspace), name, stages, log=get_run_logger().info, partial=partial)


def stage_task(retries: int, retry_delay_s: float):
    """`run_stage` with this flow run's retry settings (exponential backoff from `retry_delay_s`)."""
    delays = exponential_backoff(retry_delay_s) if retry_delay_s > 0 else 0
    return run_stage.with_options(retries=max(0, retries), retry_delay_seconds=delays)


def run_stages(stages: list[StageInfo], workspace: Path, extra_env: dict[str, str], stage_runner) -> tuple[
        list[StageOutcome], list[BaseException]]:
    """Run the stages in order, one at a time (DVC locks the workspace); a failed stage blocks its dependents."""
    outcomes: list[StageOutcome] = []
    errors: list[BaseException] = []
    failed: set[str] = set()
    for stage in stages:
        blocked = sorted(stage.upstream & failed)
        if blocked:
            failed.add(stage.name)
            outcomes.append(StageOutcome(stage.name, "not_run", reason=f"upstream {', '.join(blocked)} failed"))
            continue
        started = time.perf_counter()
        state = stage_runner(stage=stage, workspace=str(workspace), extra_env=extra_env, return_state=True)
        if state.is_completed():
            outcomes.append(StageOutcome(**state.result()))
            continue
        error = state.result(raise_on_failure=False)
        error = error if isinstance(error, BaseException) else RuntimeError(state.message or "stage failed")
        failed.add(stage.name)
        errors.append(error)
        outcomes.append(StageOutcome(stage.name, "failed", time.perf_counter() - started, str(error)))
    return outcomes, errors


def build_summary(outcomes: list[StageOutcome], *, root: Path, experiment: str | None, ref: str | None,
                  overrides: Mapping[str, Any], run_id: str | None, runs: Mapping[str, str],
                  seconds: float) -> dict[str, Any]:
    """What the flow returns and logs: per stage ran/skipped/..., seconds, key metrics, its MLflow run."""
    from prefect.runtime import flow_run

    for outcome in outcomes:
        outcome.mlflow_run_id = runs.get(outcome.stage)
    return {
        "ok": all(o.status in ("ran", "restored", "skipped") for o in outcomes),
        "repo": str(root),
        "experiment": experiment,
        "experiment_ref": ref,
        "overrides": dict(overrides),
        "mlflow_run_id": run_id or None,
        "prefect_flow_run_id": flow_run.get_id(),
        "seconds": round(seconds, 3),
        "stages": [o.to_dict() for o in outcomes],
    }


def summary_table(summary: Mapping[str, Any], markdown: bool = True) -> str:
    """The stages of a summary as a table: stage, status, seconds, key metrics."""
    rows = [(s["stage"], s["status"], f"{s['seconds']:.1f}",
             _shown_metrics(s.get("metrics", {})) or s.get("reason", "")) for s in summary["stages"]]
    header = ("stage", "status", "seconds", "key metrics / reason")
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    return "\n".join("  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip() for row in (header, *rows))


def _shown_metrics(metrics: Mapping[str, float], most: int = 5) -> str:
    shown = ", ".join(f"{k}={v:.4g}" for k, v in list(metrics.items())[:most])
    return shown + (f", ... ({len(metrics) - most} more)" if len(metrics) > most else "")


def publish_summary(summary: Mapping[str, Any], tracker: Any) -> None:
    """Log the summary: the flow log, a Prefect markdown artifact, the MLflow parent run."""
    from prefect.artifacts import create_markdown_artifact

    table = summary_table(summary)
    title = f"trainlab pipeline ({summary['experiment'] or 'workspace'}): " + ("ok" if summary["ok"] else "FAILED")
    get_run_logger().info("%s\n%s", title, summary_table(summary, markdown=False))
    create_markdown_artifact(f"## {title}\n\n{table}\n", key="pipeline-summary", description=title)
    _unless_mlflow_down(log_summary, None, tracker, summary)


def _unless_mlflow_down(fn: Callable[..., Any], default: Any, *args: Any) -> Any:
    """`fn(*args)`, or `default` with one warning line when the MLflow server does not answer (the stages' outcome
    does not depend on it: their own calls are spooled and replayed)."""
    from trainlab.tracking.outage import is_outage

    try:
        return fn(*args)
    except Exception as exc:
        if not is_outage(exc):
            raise
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        print(f"warning: MLflow server not answering; the flow's summary is not in MLflow ({first})")
        return default


@flow(name="trainlab-pipeline", log_prints=True)
def pipeline(overrides: dict[str, Any] | None = None, experiment_name: str | None = None,
             targets: list[str] | None = None, root: str | None = None, retries: int = DEFAULT_RETRIES,
             retry_delay_s: float = DEFAULT_RETRY_DELAY_S) -> dict[str, Any]:
    """Run the DVC pipeline stage by stage. With `overrides` (or a name) it runs as a DVC experiment instead:
    in a private workspace, saved as `dvc exp` EXPERIMENT_NAME; the workspace's params.yaml is never edited."""
    started = time.perf_counter()
    logger = get_run_logger()
    repo = find_root(root)
    overrides = dict(overrides or {})
    params = ov.validated_params(repo, overrides)  # bad params fail here, before anything runs
    stages = select(read_stages(repo), targets)
    experiment = experiment_name or (new_experiment_name() if overrides else None)
    if experiment:
        check_experiment_name(repo, experiment)
    flow_run_name = _flow_run_name()  # the MLflow parent run is named after its Prefect flow run
    run_name = f"{experiment} pipeline {flow_run_name}" if experiment else f"pipeline {flow_run_name}"
    with experiment_run(repo, params, overrides, experiment, stages, run_name, "pipeline", logger.info,
                        {"prefect_flow_run": flow_run_name}) as run:
        outcomes, errors = run_stages(stages, run.workspace, run.env, stage_task(retries, retry_delay_s))
        ref = None if errors or not experiment else save_experiment_task(
            str(repo), str(run.workspace), experiment, stages, partial=bool(targets))
        summary = build_summary(outcomes, root=repo, experiment=experiment, ref=ref, overrides=overrides,
                                run_id=run.tracker.run_id,
                                runs=_unless_mlflow_down(child_runs, {}, run.uri, run.tracker.run_id),
                                seconds=time.perf_counter() - started)
        publish_summary(summary, run.tracker)
        if errors:
            raise errors[0]
    return summary


def _flow_run_name() -> str:
    from prefect.runtime import flow_run

    return str(flow_run.get_name() or "")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = command_parser(prog="python -m pipelines.flow", description=__doc__)
    parser.add_argument("--override", "-S", action="append", default=[], metavar="KEY=VALUE",
                        help="change a param for this run (repeatable); the run becomes a DVC experiment")
    parser.add_argument("--name", help="DVC experiment name (default: exp-<time>-<id> when overriding)")
    parser.add_argument("--target", action="append", default=[], help="run only this stage and what it needs")
    parser.add_argument("--retries", type=int, default=DEFAULT_RETRIES, help="retries of a transient stage failure")
    parser.add_argument("--retry-delay", type=float, default=DEFAULT_RETRY_DELAY_S,
                        help="first retry delay in seconds (doubles each retry)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    return parser.parse_args(argv)


def main(argv: list[str]) -> dict[str, Any]:
    args = parse_args(argv)
    overrides = ov.parse_overrides(args.override)
    ov.validated_params(find_root(), overrides)  # one clear line for bad params, before Prefect starts
    summary = pipeline(overrides=overrides, experiment_name=args.name, targets=args.target or None,
                       retries=args.retries, retry_delay_s=args.retry_delay)
    print(json.dumps(summary, indent=2) if args.json else summary_table(summary, markdown=False))
    return summary


if __name__ == "__main__":
    run_cli(main)
