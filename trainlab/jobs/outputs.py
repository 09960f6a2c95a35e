"""A training stage's outputs kept in its spool when its MLflow server was away at the end (trainlab.tracking.spool),
and put back by the stage's next run instead of training again: the one place where tracking's outage handling
writes a stage's outputs, so it is a DVC dep of the training stages (the tracking code is not)."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from trainlab.core.atomic import atomic_dir, atomic_path
from trainlab.tracking import spool

KEPT = "outputs"  # <spool folder>/outputs/<i>: a copy of the stage's i-th output


def keeper(*outputs: Path) -> Callable[[Path], None]:
    """What `start_run_in_background(keep_outputs=...)` calls with the spool folder being written: a copy of each of
    `outputs` (a file or a folder) goes into it, in order."""
    def keep(folder: Path) -> None:
        for i, out in enumerate(Path(p) for p in outputs):
            dst = Path(folder) / KEPT / str(i)
            if out.is_dir():
                shutil.copytree(out, dst)
            elif out.exists():
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(out, dst)
    return keep


def restore(folder: Path, targets: Sequence[Path]) -> None:
    """Put the kept copies at `targets` (in the order they were kept), each atomically."""
    for i, target in enumerate(targets):
        src = Path(folder) / KEPT / str(i)
        if src.is_dir():
            with atomic_dir(target) as tmp:
                shutil.copytree(src, tmp, dirs_exist_ok=True)
        elif src.is_file():
            with atomic_path(target) as tmp:
                shutil.copy2(src, tmp)


def complete_spooled_stage(stage: str, key: str, outputs: Sequence[Path], root: Path = spool.SPOOL_ROOT) -> str | None:
    """If a run of `stage` with this `key` (same params and data) was spooled: replay what is left of it (exit 6 if
    the server still does not answer), put its outputs back and remove the spool. The MLflow run id, else None."""
    folder = spool.spool_folder(stage, key, root)
    if not (folder / "run.json").is_file():
        return None
    run_id = spool.read_run(folder)["run_id"] if spool.is_logged(folder) else spool.replay(folder)[0]
    restore(folder, outputs)
    spool.remove(folder)
    return run_id
