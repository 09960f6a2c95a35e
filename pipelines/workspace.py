"""Private workspaces for DVC experiments: a Git clone sharing the repo's DVC cache, saved back as `dvc exp` refs.

DVC holds a repo-wide lock, so two pipelines cannot run in one workspace at once. An experiment (a flow run with
overrides, or one sweep point) therefore runs in its own clone of the current commit plus the workspace's
uncommitted changes, with the main repo's DVC cache; `dvc exp save` records it and `git push` hands the
experiment ref back to the main repo, where `dvc exp show` lists it. The main workspace and its params.yaml are
never touched.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipelines.dag import StageInfo
from pipelines.dvc_cli import cache_dir, run_dvc, stage_env
from trainlab.core.errors import UserError

PARAMS_FILE = "params.yaml"
EXPS_NAMESPACE = "refs/exps"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_GIT_IDENTITY = {"user.name": "trainlab pipeline", "user.email": "trainlab-pipeline@localhost"}


class ExperimentError(UserError):
    """An experiment cannot be set up or saved (no commit yet, a name taken, a Git failure)."""


def git(args: list[str], cwd: str | os.PathLike, check: bool = True) -> subprocess.CompletedProcess:
    """`git <args>` in `cwd`; output captured; ExperimentError with git's message when `check` and it fails."""
    proc = subprocess.run(["git", *args], cwd=str(cwd), capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        message = (proc.stderr or proc.stdout).strip().splitlines()
        detail = message[-1] if message else f"exit {proc.returncode}"
        raise ExperimentError(f"`git {' '.join(args[:3])}` failed in {cwd}: {detail}")
    return proc


def new_experiment_name(prefix: str = "exp") -> str:
    """A unique, valid experiment name: `<prefix>-YYYYmmdd-HHMMSS-xxxx`."""
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:4]}"


def head_commit(root: str | os.PathLike) -> str:
    proc = git(["rev-parse", "--verify", "--quiet", "HEAD^{commit}"], root, check=False)
    if proc.returncode != 0:
        raise ExperimentError(f"{root}: no Git commit yet; DVC experiments start from a commit, so commit first")
    return proc.stdout.strip()


def experiment_ref(baseline: str, name: str) -> str:
    """DVC's ref for experiment `name` on `baseline`: refs/exps/<sha[:2]>/<sha[2:]>/<name>."""
    return f"{EXPS_NAMESPACE}/{baseline[:2]}/{baseline[2:]}/{name}"


def check_experiment_name(root: str | os.PathLike, name: str) -> None:
    """A valid name (letters, digits, . _ -) not yet used on the current commit."""
    if not _NAME_RE.match(name) or ".." in name or name.endswith((".lock", ".")):
        raise ExperimentError(f"experiment name {name!r} is not valid: use letters, digits, '.', '_' and '-' "
                              "(starting with a letter or digit)")
    ref = experiment_ref(head_commit(root), name)
    if git(["show-ref", "--verify", "--quiet", ref], root, check=False).returncode == 0:
        raise ExperimentError(f"a DVC experiment named {name!r} already exists on this commit; choose another "
                              f"name or remove it with `dvc exp remove {name}`")


def apply_overrides(params_file: str | os.PathLike, overrides: Mapping[str, Any]) -> None:
    """Set dotted keys (`classifier.lr`) in a params YAML file, keeping its comments and layout."""
    from dvc.utils.serialize import modify_yaml

    with modify_yaml(str(params_file)) as data:
        for dotted, value in overrides.items():
            *parents, leaf = dotted.split(".")
            node = data
            for key in parents:
                node = node.setdefault(key, {})
            node[leaf] = value


@contextmanager
def experiment_workspace(root: str | os.PathLike, name: str, stages: list[StageInfo],
                         overrides: Mapping[str, Any], log: Callable[[str], None] = print,
                         keep: bool = False) -> Iterator[Path]:
    """A clone of `root` for experiment `name` with `overrides` applied; removed afterwards unless `keep`."""
    root = Path(root).resolve()
    holder = Path(tempfile.mkdtemp(prefix=f"trainlab-{name}-"))
    workspace = holder / root.name
    try:
        create_workspace(root, workspace, stages, log)
        apply_overrides(workspace / PARAMS_FILE, overrides)
        yield workspace
    finally:
        if keep:
            log(f"experiment workspace kept at {workspace}")
        else:
            shutil.rmtree(holder, ignore_errors=True)


def create_workspace(root: Path, workspace: Path, stages: list[StageInfo], log: Callable[[str], None]) -> None:
    """Clone HEAD, copy the uncommitted changes, share the DVC cache and bring the outputs DVC can reuse."""
    baseline = head_commit(root)
    git(["clone", "--quiet", "--shared", "--no-checkout", str(root), str(workspace)], root)
    git(["checkout", "--quiet", "--detach", baseline], workspace)
    for key, value in _GIT_IDENTITY.items():
        if git(["config", key], workspace, check=False).returncode != 0:
            git(["config", key, value], workspace)
    copied = copy_uncommitted(root, workspace)
    env = stage_env()
    result = run_dvc(["config", "--local", "cache.dir", str(cache_dir(root))], workspace, env)
    if result.returncode != 0:
        raise ExperimentError(f"cannot share the DVC cache with {workspace}: {result.output.strip()}")
    reuse_outputs(root, workspace, stages, env)
    log(f"experiment workspace {workspace} (commit {baseline[:7]}, {copied} uncommitted file(s) copied)")


def copy_uncommitted(root: Path, workspace: Path) -> int:
    """Copy modified and untracked (not ignored) files of `root` into `workspace`; mirror deletions."""
    changed = git(["diff", "--name-only", "-z", "HEAD"], root).stdout.split("\0")
    untracked = git(["ls-files", "--others", "--exclude-standard", "-z"], root).stdout.split("\0")
    count = 0
    for rel in filter(None, changed + untracked):
        src, dst = root / rel, workspace / rel
        if src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
            count += 1
        elif not src.exists():
            dst.unlink(missing_ok=True)
    return count


def copy_worktree(src: Path, dst: Path, skip: Callable[[str], bool] = lambda rel: False) -> None:
    """The files of `src`'s working tree as they are now (tracked, and untracked but not ignored) into `dst`,
    except the relative paths `skip` names."""
    listed = git(["ls-files", "--cached", "--others", "--exclude-standard", "-z"], src).stdout.split("\0")
    for rel in filter(None, listed):
        if not skip(rel) and (src / rel).is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / rel, dst / rel)


def reuse_outputs(root: Path, workspace: Path, stages: list[StageInfo], env: Mapping[str, str]) -> None:
    """Check out cached outputs from the shared cache and copy `cache: false` outputs from `root`.

    DVC then compares them with dvc.lock: a stage whose inputs the overrides leave alone is up to date and
    skipped, the others run. Nothing is trusted blindly; a copied file that does not match dvc.lock re-runs its stage.
    """
    for stage in stages:
        for rel in stage.uncached_outs:
            src, dst = root / rel, workspace / rel
            if src.is_dir():
                shutil.copytree(src, dst, dirs_exist_ok=True)
            elif src.is_file():
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)
    run_dvc(["checkout", "--allow-missing", "--quiet"], workspace, env)  # best effort: a miss just re-runs


def save_experiment(root: Path, workspace: Path, name: str, stages: list[StageInfo],
                    log: Callable[[str], None] = print, partial: bool = False) -> str:
    """`dvc exp save` in the workspace (with its metrics and other uncached outs) and push the ref to `root`.

    `partial`: only `stages` ran (a targeted run), so only they are committed; the others keep their old
    dvc.lock entries and show as changed when the experiment is applied, as they should.
    """
    include = [p for s in stages for p in s.uncached_outs if (workspace / p).exists()]
    args = ["exp", "save", "--name", name] + [a for p in include for a in ("--include-untracked", p)]
    args += [s.name for s in stages] if partial else []
    result = run_dvc(args, workspace, stage_env())
    if result.returncode != 0:
        raise ExperimentError(f"`dvc exp save` failed for {name}: {result.output.strip()[-500:]}")
    ref = experiment_ref(head_commit(workspace), name)
    git(["push", "--quiet", str(root), f"{ref}:{ref}"], workspace)
    log(f"saved DVC experiment {name} ({ref}); see `dvc exp show`")
    return ref
