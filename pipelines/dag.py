"""The stage DAG read from DVC itself (dvc.yaml through DVC's own index): no second copy of the pipeline."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from trainlab.core.errors import UserError


class DagError(UserError):
    """dvc.yaml cannot be read, or a requested stage does not exist."""


@dataclass(frozen=True)
class StageInfo:
    """One pipeline stage as DVC sees it; paths are relative to the repo root."""

    name: str                                    # DVC's address: `train_classifier`, or `sub/dvc.yaml:name`
    cmd: str
    upstream: frozenset[str] = frozenset()       # every stage this one depends on, transitively
    metrics: tuple[str, ...] = ()                # metrics files (`dvc metrics show`)
    uncached_outs: tuple[str, ...] = ()          # outs with `cache: false` (kept in the workspace, not the cache)
    outs: tuple[str, ...] = field(default=(), compare=False)


def find_root(start: str | os.PathLike | None = None) -> Path:
    """The DVC repo root containing `start` (default: the current folder)."""
    from dvc.exceptions import NotDvcRepoError
    from dvc.repo import Repo

    try:
        return Path(Repo.find_root(str(start or Path.cwd()))).resolve()
    except NotDvcRepoError:
        raise DagError(f"{Path(start or Path.cwd()).resolve()}: not inside a DVC repository (run `dvc init`)") from None


def read_stages(root: str | os.PathLike) -> list[StageInfo]:
    """The pipeline stages of the repo at `root`, in a dependency order (DVC's graph, ties broken by name)."""
    import networkx as nx
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    root = Path(root).resolve()
    try:
        with Repo(str(root)) as repo:
            graph = repo.index.graph  # edges point from a stage to the stages it depends on
            runnable = [s for s in graph if getattr(s, "cmd", None)]
            wanted = set(runnable)
            order = nx.lexicographical_topological_sort(graph.reverse(copy=False), key=lambda s: address(s, root))
            return [_stage_info(s, graph, wanted, root) for s in order if s in wanted]
    except DvcException as exc:
        raise DagError(f"{root}: cannot read the DVC pipeline: {exc}") from None


def _stage_info(stage, graph, wanted: set, root: Path) -> StageInfo:
    import networkx as nx

    def rel(out) -> str:
        return os.path.relpath(out.fs_path, root)

    upstream = frozenset(address(s, root) for s in nx.descendants(graph, stage) if s in wanted)
    return StageInfo(
        name=address(stage, root),
        cmd=stage.cmd if isinstance(stage.cmd, str) else " && ".join(stage.cmd),
        upstream=upstream,
        metrics=tuple(rel(o) for o in stage.outs if o.metric),
        uncached_outs=tuple(rel(o) for o in stage.outs if not o.use_cache),
        outs=tuple(rel(o) for o in stage.outs),
    )


def address(stage, root: Path) -> str:
    """How `dvc repro` run in `root` names the stage: `name`, or `sub/dvc.yaml:name` outside the root dvc.yaml."""
    dvcfile = os.path.relpath(stage.path, root)
    name = getattr(stage, "name", None)
    if not name:
        return dvcfile
    return name if dvcfile == "dvc.yaml" else f"{dvcfile}:{name}"


def select(stages: list[StageInfo], targets: list[str] | None) -> list[StageInfo]:
    """`targets` and everything they depend on, in order; all stages when `targets` is empty."""
    if not targets:
        return list(stages)
    by_name = {s.name: s for s in stages}
    unknown = [t for t in targets if t not in by_name]
    if unknown:
        raise DagError(f"unknown stage(s) {', '.join(unknown)}; the pipeline has: {', '.join(by_name)}")
    keep = set(targets).union(*(by_name[t].upstream for t in targets))
    return [s for s in stages if s.name in keep]
