"""What a flow run and a sweep point share: a parent MLflow run (tagged with the commit and the experiment, the
overrides logged), the workspace the stages run in (a private clone for an experiment), and the environment that
nests the stages' own runs under that parent."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.dag import StageInfo
from pipelines.runs import log_overrides, parent_run, stage_run_env, tracking_uri
from pipelines.workspace import experiment_workspace
from trainlab.core.config import Params
from trainlab.core.provenance import git_state


@dataclass
class ExperimentRun:
    tracker: Any  # the parent run (a NullTracker when tracking is off)
    workspace: Path  # where the stages run: the repo itself, or the experiment's clone
    env: dict[str, str]  # for the stage subprocesses: the store, the parent run, the experiment name
    uri: str | None  # the tracking URI; None when tracking is off


@contextlib.contextmanager
def experiment_run(repo: Path, params: Params, overrides: Mapping[str, Any], experiment: str | None,
                   stages: list[StageInfo], run_name: str, kind: str, log: Callable[[str], None],
                   tags: Mapping[str, Any] | None = None, parent_run_id: str | None = None) -> Iterator[ExperimentRun]:
    """The parent run and workspace of one pipeline run; `experiment` None runs in `repo` itself."""
    uri = tracking_uri(repo, params)
    all_tags = {**git_state(str(repo)), "dvc_experiment": experiment or "", **(tags or {})}
    with parent_run(params, repo, run_name, kind, all_tags, parent_run_id=parent_run_id) as tracker:
        log_overrides(tracker, overrides, experiment)
        workspace = contextlib.nullcontext(repo) if experiment is None else \
            experiment_workspace(repo, experiment, stages, overrides, log=log)
        with workspace as path:
            yield ExperimentRun(tracker, Path(path), stage_run_env(uri, tracker.run_id, experiment), uri)
