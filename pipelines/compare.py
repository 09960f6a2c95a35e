"""Compare a model's MLflow runs in one table and promote the best registered version to the `champion` alias."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from pipelines.dag import find_root
from pipelines.overrides import validated_params
from pipelines.runs import child_runs, tracking_uri
from trainlab import tasks
from trainlab.core.cli import command_parser, run_cli
from trainlab.core.errors import UserError
from trainlab.tracking.registry import CHAMPION, model_name
from trainlab.tracking.uri import mlflow_client

METRIC_PREFIXES = ("test_", "baseline_")


class CompareError(UserError):
    """The comparison cannot be made (tracking off, no such experiment)."""


def stage_name(task: str) -> str:
    return tasks.get(task).stage


def primary_metric(task: str) -> str:
    """The metric a model is judged on: its task's primary metric (trainlab.tasks.metrics) on the test split."""
    return f"test_{tasks.get(task).primary_metric}"


@dataclass
class RunRow:
    """One training run of a model, as the table shows it."""

    run_id: str
    version: str | None
    champion: bool
    params: dict[str, str]
    metrics: dict[str, float]
    start_ms: int
    seconds: float | None


@dataclass
class Decision:
    """What `--promote` decided for one model, and why."""

    model: str
    promoted: bool
    reason: str
    version: str | None = None
    previous: str | None = None
    metric: str = ""
    value: float | None = None
    previous_value: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def client_for(root: str | os.PathLike) -> tuple[Any, str, str]:
    """(MlflowClient, tracking URI, experiment name) for the repo at `root`."""
    params = validated_params(root)
    uri = tracking_uri(root, params)
    if uri is None:
        raise CompareError("tracking is disabled (tracking.enabled: false in params.yaml): nothing to compare")
    return mlflow_client(uri), uri, params.tracking.experiment


def versions_by_run(client: Any, task: str) -> dict[str, str]:
    """{run id: version} of the registered model's versions (the newest version per run)."""
    found: dict[str, str] = {}
    for v in sorted(client.search_model_versions(f"name = '{model_name(task)}'"), key=lambda v: int(v.version)):
        if v.run_id:
            found[v.run_id] = str(v.version)
    return found


def champion_version(client: Any, task: str) -> Any | None:
    """The version holding the `champion` alias, or None."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(model_name(task), CHAMPION)
    except MlflowException:
        return None


def collect_runs(client: Any, experiment: str, task: str, limit: int = 20) -> list[RunRow]:
    """The model's finished training runs, best first by its primary metric (runs without it last)."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise CompareError(f"no MLflow experiment named {experiment!r} (tracking.experiment in params.yaml)")
    metric, better = primary_metric(task), 1 if tasks.get(task).higher_is_better else -1
    runs = client.search_runs([found.experiment_id], max_results=max(limit, 1) * 5,
                              filter_string=f"tags.stage = '{stage_name(task)}' and attributes.status = 'FINISHED'",
                              order_by=[f"metrics.{metric} {'DESC' if better > 0 else 'ASC'}",
                                        "attributes.start_time DESC"])
    versions = versions_by_run(client, task)
    champ = champion_version(client, task)
    rows = [RunRow(r.info.run_id, versions.get(r.info.run_id), bool(champ and champ.run_id == r.info.run_id),
                   dict(r.data.params), dict(r.data.metrics), r.info.start_time or 0,
                   (r.info.end_time - r.info.start_time) / 1000 if r.info.end_time and r.info.start_time else None)
            for r in runs]
    rows.sort(key=lambda row: (metric not in row.metrics, -better * row.metrics.get(metric, 0.0), -row.start_ms))
    return rows[:limit]


def differing_params(rows: list[RunRow]) -> list[str]:
    """The param keys whose values are not the same in every row."""
    keys = sorted({k for row in rows for k in row.params})
    return [k for k in keys if len({row.params.get(k, "") for row in rows}) > 1]


def metric_columns(rows: list[RunRow], task: str) -> list[str]:
    """`test_*` and `baseline_*` metrics, the primary one first."""
    primary = primary_metric(task)
    keys = sorted({k for row in rows for k in row.metrics if k.startswith(METRIC_PREFIXES)} - {primary})
    return [primary] + keys


def table_rows(rows: list[RunRow], task: str) -> tuple[list[str], list[list[str]]]:
    """Header and cells: rank, run, version, the differing params, the metrics, duration, start."""
    params, metrics = differing_params(rows), metric_columns(rows, task)
    header = ["#", "run", "version"] + params + metrics + ["duration", "started (UTC)"]
    cells = []
    for rank, row in enumerate(rows, 1):
        version = f"v{row.version}" + (f" ({CHAMPION})" if row.champion else "") if row.version else "-"
        cells.append([str(rank), row.run_id[:8], version]
                     + [row.params.get(k, "-") for k in params]
                     + [f"{row.metrics[k]:.4f}" if k in row.metrics else "-" for k in metrics]
                     + [f"{row.seconds:.1f}s" if row.seconds is not None else "-", _when(row.start_ms)])
    return header, cells


def format_table(rows: list[RunRow], task: str, markdown: bool = False) -> str:
    """The comparison as aligned text, or as a markdown table for a PR comment."""
    header, cells = table_rows(rows, task)
    if markdown:
        title = f"**{model_name(task)}**: {len(rows)} run(s), sorted by `{primary_metric(task)}`"
        lines = [title, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return "\n".join(lines + ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in cells])
    widths = [max(len(x) for x in col) for col in zip(header, *cells)]
    return "\n".join("  ".join(x.ljust(w) for x, w in zip(row, widths)).rstrip() for row in [header, *cells])


def _when(start_ms: int) -> str:
    if not start_ms:
        return "-"
    return datetime.fromtimestamp(start_ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M")


def version_metric(client: Any, version: Any, metric: str) -> float | None:
    """The primary metric of the run that produced a model version (None when it has no such metric)."""
    if not version.run_id:
        return None
    try:
        return client.get_run(version.run_id).data.metrics.get(metric)
    except Exception:  # noqa: BLE001 - a deleted run: the version cannot be judged
        return None


def promote(client: Any, task: str, candidates: Iterable[str] | None = None) -> Decision:
    """Point `champion` at the best candidate version if it beats the current champion on the primary metric.

    `candidates` are version numbers (default: every version). Ties keep the champion. With no champion yet,
    the best candidate becomes champion.
    """
    name, metric = model_name(task), primary_metric(task)
    sign = 1 if tasks.get(task).higher_is_better else -1  # compared as sign x value: larger is better
    wanted = None if candidates is None else {str(c) for c in candidates}
    scored = [(sign * value, int(v.version), v) for v in client.search_model_versions(f"name = '{name}'")
              if (wanted is None or str(v.version) in wanted)
              for value in [version_metric(client, v, metric)] if value is not None]
    champ = champion_version(client, task)
    champ_value = version_metric(client, champ, metric) if champ else None
    decision = Decision(name, False, "", metric=metric, previous=champ.version if champ else None,
                        previous_value=champ_value)
    if not scored:
        decision.reason = f"{name}: no candidate version with a {metric} metric" + (
            f"; champion stays v{champ.version}" if champ else "")
        return decision
    signed, _, best = max(scored, key=lambda s: (s[0], -s[1]))  # best metric; on a tie the older version
    value = sign * signed
    decision.version, decision.value = str(best.version), value
    if champ is not None and str(champ.version) == str(best.version):
        decision.reason = f"{name}: champion v{champ.version} ({metric} {champ_value:.4f}) is already the best"
        return decision
    if champ is not None and champ_value is not None and signed <= sign * champ_value:
        decision.reason = (f"{name}: v{best.version} ({metric} {value:.4f}) does not beat champion "
                           f"v{champ.version} ({champ_value:.4f}); champion stays")
        return decision
    client.set_registered_model_alias(name, CHAMPION, str(best.version))
    decision.promoted = True
    decision.reason = (f"{name}: v{best.version} ({metric} {value:.4f}) is the new champion" + (
        f", replacing v{champ.version} ({_fmt(champ_value)})" if champ else " (there was none)"))
    return decision


def _fmt(value: float | None) -> str:
    return f"{value:.4f}" if value is not None else "no metric"


def new_versions(client: Any, task: str, run_ids: Iterable[str]) -> list[str]:
    """The versions of the model registered by the given runs."""
    runs = set(run_ids)
    return [str(v.version) for v in client.search_model_versions(f"name = '{model_name(task)}'") if v.run_id in runs]


def promote_new_models(root: str | os.PathLike, parent_run_id: str | None,
                       models: Iterable[str] | None = None) -> list[Decision]:
    """After a pipeline run: for each model, promote a version trained in that run if it beats the champion.

    A model with no champion yet considers all its versions (the first champion is the best there is).
    """
    client, uri, _ = client_for(root)
    runs = child_runs(uri, parent_run_id)
    decisions = []
    for task in models or tasks.names():
        fresh = new_versions(client, task, [runs[s] for s in runs if s == stage_name(task)])
        if champion_version(client, task) is None:
            decisions.append(promote(client, task))
        elif fresh:
            decisions.append(promote(client, task, fresh))
        else:
            decisions.append(Decision(model_name(task), False, f"{model_name(task)}: no new version in this run "
                                      "(its stage was up to date); champion stays", metric=primary_metric(task)))
    return decisions


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = command_parser(prog="python -m pipelines.compare", description=__doc__)
    parser.add_argument("model", choices=sorted(tasks.names()), help="which model's runs to compare")
    parser.add_argument("--markdown", action="store_true", help="print a markdown table (for a PR comment)")
    parser.add_argument("--promote", action="store_true",
                        help=f"move the `{CHAMPION}` alias to the best version if it beats the current champion")
    parser.add_argument("--limit", type=int, default=20, help="at most this many runs (default 20)")
    return parser.parse_args(argv)


def main(argv: list[str]) -> Decision | None:
    args = parse_args(argv)
    client, uri, experiment = client_for(find_root())
    rows = collect_runs(client, experiment, args.model, args.limit)
    if rows:
        print(format_table(rows, args.model, args.markdown))
    else:
        print(f"no finished {stage_name(args.model)} runs in MLflow experiment {experiment!r} ({uri})")
    if not args.promote:
        return None
    decision = promote(client, args.model)
    print(("\n" if rows else "") + ("promoted: " if decision.promoted else "not promoted: ") + decision.reason)
    return decision


if __name__ == "__main__":
    run_cli(main)
