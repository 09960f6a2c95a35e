"""The search space file of `pipelines.search`: the objective, the sampler and pruner, each param's range (linear or
log) or choices, conditions, fixed overrides and enqueued trials; checked against params.yaml's schema, each error
naming the file, line and key."""

from __future__ import annotations

import difflib
import hashlib
import json
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError

from pipelines.dag import StageInfo
from pipelines.overrides import validated_params
from trainlab.core.config import Params
from trainlab.core.errors import ParamsError

SECTIONS = {"objective", "params", "fixed", "sampler", "pruner", "targets", "enqueue"}
PARAM_KEYS = {"low", "high", "log", "step", "choices", "when"}
PRUNERS = {"none": set(), "median": {"startup_trials", "warmup_epochs"},
           "percentile": {"percentile", "startup_trials", "warmup_epochs"},
           "threshold": {"lower", "upper", "warmup_epochs"}}
SAMPLER_KEYS = {"seed", "startup_trials"}
HISTORY_FILE = "history.csv"  # the per-epoch metrics a training stage writes (trainlab.jobs.train.write_history)
_SCALARS = (str, int, float, bool, type(None))


class SearchSpaceError(ParamsError):
    """The search space file is invalid (exit 2, like params.yaml)."""


@dataclass(frozen=True)
class Param:
    key: str                        # a dotted params.yaml key: classifier.lr
    kind: str                       # float | int | categorical
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple = ()
    when: tuple[tuple[str, tuple], ...] = ()  # (key, allowed values): suggested only if every earlier choice fits

    def active(self, chosen: Mapping[str, Any]) -> bool:
        return all(k in chosen and chosen[k] in allowed for k, allowed in self.when)

    def suggest(self, trial: Any) -> Any:
        if self.kind == "categorical":
            return trial.suggest_categorical(self.key, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(self.key, int(self.low), int(self.high), step=int(self.step or 1), log=self.log)
        return trial.suggest_float(self.key, float(self.low), float(self.high), step=self.step, log=self.log)


@dataclass(frozen=True)
class Objective:
    stage: str        # the DVC stage whose training is judged: train_classifier
    task: str         # its task: classifier
    metric: str       # a per-epoch validation metric of that task: val_accuracy
    direction: str    # maximize | minimize
    history: str      # the stage's history.csv (relative to the repo)


@dataclass(frozen=True)
class SearchSpace:
    path: Path
    objective: Objective
    params: tuple[Param, ...]
    fixed: dict[str, Any] = field(default_factory=dict)
    targets: tuple[str, ...] = ()
    pruner: dict[str, Any] = field(default_factory=lambda: {"kind": "none"})
    startup_trials: int = 10
    seed: int = 0
    enqueue: tuple[dict[str, Any], ...] = ()  # trials to run first, with these values of the searched params

    def suggest(self, trial: Any) -> dict[str, Any]:
        """The overrides of one trial: the fixed ones, and a value for each param whose conditions hold."""
        chosen: dict[str, Any] = {}
        for param in self.params:
            if param.active(chosen):
                chosen[param.key] = param.suggest(trial)
        return {**self.fixed, **chosen}

    def digest(self) -> str:
        """What a study was created from: resuming it with another space is refused."""
        data = {"objective": [self.objective.stage, self.objective.metric, self.objective.direction],
                "params": [repr(p) for p in self.params], "fixed": self.fixed, "pruner": self.pruner,
                "startup_trials": self.startup_trials, "seed": self.seed, "enqueue": self.enqueue}
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


class _Lines:
    """The YAML text's line of each key path, for messages."""

    def __init__(self, path: Path, text: str) -> None:
        self.path, self.lines = path, {}
        self._walk(yaml.compose(text, Loader=yaml.SafeLoader), ())

    def _walk(self, node: Any, at: tuple) -> None:
        if not isinstance(node, yaml.MappingNode):
            return
        for key, value in node.value:
            here = (*at, key.value)
            if here in self.lines:
                raise SearchSpaceError(f"{self.path}:{key.start_mark.line + 1}: {'.'.join(here)} is given twice")
            self.lines[here] = key.start_mark.line + 1
            self._walk(value, here)

    def error(self, at: tuple, message: str) -> SearchSpaceError:
        for n in range(len(at), 0, -1):
            if at[:n] in self.lines:
                return SearchSpaceError(f"{self.path}:{self.lines[at[:n]]}: {'.'.join(at)}: {message}")
        return SearchSpaceError(f"{self.path}: {'.'.join(at) or 'top level'}: {message}")


def load_space(path: str | Path, repo: Path, stages: list[StageInfo]) -> SearchSpace:
    """Read and check a search space file against params.yaml's schema and the DVC pipeline's stages."""
    path = Path(path)
    try:
        text = path.read_text()
        raw = yaml.safe_load(text)
        lines = _Lines(path, text)
    except FileNotFoundError:
        raise SearchSpaceError(f"{path}: search space file not found") from None
    except yaml.YAMLError as exc:
        raise SearchSpaceError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise SearchSpaceError(f"{path}: expected a mapping with the sections {', '.join(sorted(SECTIONS))}")
    _only(raw, SECTIONS, (), lines)
    base = validated_params(repo)
    objective = _objective(raw.get("objective"), stages, repo, lines)
    fixed = {k: _checked_value(k, v, ("fixed", k), lines) for k, v in _mapping(raw, "fixed", lines).items()}
    params = _params(_mapping(raw, "params", lines), lines)
    if not params:
        raise lines.error(("params",), "no params to search; give at least one, e.g. classifier.lr: "
                          "{low: 1.0e-4, high: 1.0e-2, log: true}")
    clash = sorted(set(fixed) & {p.key for p in params})
    if clash:
        raise lines.error(("fixed", clash[0]), "is also a searched param; keep it in one section")
    targets = _targets(raw.get("targets"), objective, stages, lines)
    sampler = _mapping(raw, "sampler", lines)
    _only(sampler, SAMPLER_KEYS, ("sampler",), lines)
    space = SearchSpace(path, objective, params, fixed, targets, _pruner(_mapping(raw, "pruner", lines), lines),
                        _count(sampler.get("startup_trials", 10), ("sampler", "startup_trials"), lines),
                        _count(sampler.get("seed", base.base.seed), ("sampler", "seed"), lines),
                        _enqueue(raw.get("enqueue"), params, lines))
    _check_together(space, repo, lines)
    return space


def _only(data: Mapping, allowed: set[str], at: tuple, lines: _Lines) -> None:
    for key in data:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise lines.error((*at, key), f"unknown key{hint} Valid keys here: {', '.join(sorted(allowed))}")


def _mapping(raw: Mapping, key: str, lines: _Lines) -> dict:
    value = raw.get(key) or {}
    if not isinstance(value, dict):
        raise lines.error((key,), f"expected a mapping, got {type(value).__name__}")
    return value


def _count(value: Any, at: tuple, lines: _Lines) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise lines.error(at, f"got {value!r}; expected a whole number, 0 or more")
    return value


def _field(key: Any, at: tuple, lines: _Lines):
    """The pydantic field a dotted params.yaml key names (a clear error with the nearest key otherwise)."""
    if not isinstance(key, str) or not key:
        raise lines.error(at, "expected a dotted params.yaml key such as classifier.lr")
    model: type[BaseModel] = Params
    parts = key.split(".")
    for i, part in enumerate(parts):
        fields = model.model_fields
        if part not in fields:
            here = ".".join(parts[:i])
            close = difflib.get_close_matches(part, list(fields), n=1)
            hint = f"; did you mean {'.'.join(parts[:i] + close)!r}?" if close else ""
            raise lines.error(at, f"not a key of params.yaml{hint} Keys of {here or 'the top level'}: "
                              f"{', '.join(fields)}")
        info = fields[part]
        if i == len(parts) - 1:
            if _is_model(info.annotation):
                raise lines.error(at, f"{key} is a section; name one of its keys")
            return info
        if not _is_model(info.annotation):
            raise lines.error(at, f"{'.'.join(parts[:i + 1])} is not a section")
        model = info.annotation
    raise AssertionError("unreachable")


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _checked_value(key: str, value: Any, at: tuple, lines: _Lines) -> Any:
    """`value` valid for params.yaml's `key` (its type and range), as the file gives it."""
    info = _field(key, at[:-1] if at[-1] in PARAM_KEYS else at, lines)
    try:
        kind = Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation
        TypeAdapter(kind).validate_python(value)
    except ValidationError as exc:
        raise lines.error(at, f"got {value!r} for {key}; {exc.errors()[0]['msg']}") from None
    return value


def _numeric_kind(annotation: Any) -> str | None:
    args = typing.get_args(annotation) if isinstance(annotation, types.UnionType) or \
        typing.get_origin(annotation) is typing.Union else (annotation,)
    # a constrained member of a union (epochs: a whole number or auto) keeps its constraints in Annotated
    args = [typing.get_args(a)[0] if typing.get_origin(a) is typing.Annotated else a for a in args]
    if float in args:
        return "float"
    if int in args:
        return "int"
    return None


def _params(raw: Mapping, lines: _Lines) -> tuple[Param, ...]:
    params: list[Param] = []
    for key, spec in raw.items():
        at = ("params", key)
        info = _field(key, at, lines)
        if not isinstance(spec, dict):
            raise lines.error(at, "expected {low: .., high: ..[, log: true][, step: ..]} or {choices: [...]}; a "
                              "value that does not vary goes under fixed:")
        _only(spec, PARAM_KEYS, at, lines)
        when = _when(spec.get("when"), params, at, lines)
        if "choices" in spec:
            params.append(_choices(key, spec, when, at, lines))
            continue
        kind = _numeric_kind(info.annotation)
        if kind is None:
            raise lines.error(at, f"{key} is not a number; give its values as choices: [...]")
        params.append(_range(key, kind, spec, when, at, lines))
    return tuple(params)


def _choices(key: str, spec: Mapping, when: tuple, at: tuple, lines: _Lines) -> Param:
    choices = spec["choices"]
    extra = sorted(set(spec) - {"choices", "when"})
    if extra:
        raise lines.error((*at, extra[0]), "not used with choices")
    if not isinstance(choices, list) or not choices:
        raise lines.error((*at, "choices"), "expected a non-empty list of values")
    for value in choices:
        if not isinstance(value, _SCALARS):
            raise lines.error((*at, "choices"), f"{value!r}: each choice must be a number, string, bool or null")
        _checked_value(key, value, (*at, "choices"), lines)
    if len(set(map(repr, choices))) < len(choices):
        raise lines.error((*at, "choices"), "a value is listed twice")
    return Param(key, "categorical", choices=tuple(choices), when=when)


def _range(key: str, kind: str, spec: Mapping, when: tuple, at: tuple, lines: _Lines) -> Param:
    for bound in ("low", "high"):
        if bound not in spec:
            raise lines.error(at, f"missing {bound}: (a range needs low and high)")
        value = spec[bound]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind == "int" and
                                                                                not isinstance(value, int)):
            takes = "whole numbers" if kind == "int" else "numbers"
            raise lines.error((*at, bound), f"got {value!r}; {key} takes {takes}")
        _checked_value(key, value, (*at, bound), lines)
    low, high, log, step = spec["low"], spec["high"], spec.get("log", False), spec.get("step")
    if not isinstance(log, bool):
        raise lines.error((*at, "log"), f"got {log!r}; true or false")
    if not low < high:
        raise lines.error(at, f"low ({low}) must be below high ({high})")
    if log and low <= 0:
        raise lines.error((*at, "low"), f"a log range needs low > 0, got {low}")
    if step is not None:
        if log:
            raise lines.error((*at, "step"), "a log range takes no step")
        if isinstance(step, bool) or not isinstance(step, (int, float)) or step <= 0 or (kind == "int" and
                                                                                        not isinstance(step, int)):
            raise lines.error((*at, "step"), f"got {step!r}; a positive {'whole ' if kind == 'int' else ''}number")
    return Param(key, kind, low=low, high=high, log=log, step=step, when=when)


def _when(raw: Any, earlier: list[Param], at: tuple, lines: _Lines) -> tuple[tuple[str, tuple], ...]:
    """Conditions on earlier choice params: `when: {classifier.arch: resnet_small}` (or a list of values)."""
    if raw is None:
        return ()
    if not isinstance(raw, dict) or not raw:
        raise lines.error((*at, "when"), "expected {KEY: VALUE or [VALUES]} naming an earlier choices param")
    by_key = {p.key: p for p in earlier if p.kind == "categorical"}
    conditions = []
    for key, allowed in raw.items():
        if key not in by_key:
            raise lines.error((*at, "when", key), "not a choices param given above this one; conditions name an "
                              f"earlier param with choices ({', '.join(by_key) or 'none yet'})")
        values = tuple(allowed if isinstance(allowed, list) else [allowed])
        unknown = [v for v in values if v not in by_key[key].choices]
        if unknown:
            raise lines.error((*at, "when", key),
                              f"{unknown[0]!r} is not one of its choices {list(by_key[key].choices)}")
        conditions.append((key, values))
    return tuple(conditions)


def _enqueue(raw: Any, params: tuple[Param, ...], lines: _Lines) -> tuple[dict[str, Any], ...]:
    """Trials to run first: each a mapping of searched params to values inside their ranges or choices."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(t, dict) and t for t in raw):
        raise lines.error(("enqueue",), "expected a list of {param: value, ...} mappings")
    by_key = {p.key: p for p in params}
    for i, trial in enumerate(raw, start=1):
        for key, value in trial.items():
            p = by_key.get(key)
            where = f"trial {i}: {key}={value!r}"
            if p is None:
                raise lines.error(("enqueue",), f"{where}: not a searched param ({', '.join(by_key)})")
            inside = value in p.choices if p.kind == "categorical" else (
                isinstance(value, (int, float)) and not isinstance(value, bool) and p.low <= value <= p.high)
            if not inside:
                raise lines.error(("enqueue",), f"{where}: outside its "
                                  f"{'choices' if p.kind == 'categorical' else 'range'}")
    return tuple(raw)


def _objective(raw: Any, stages: list[StageInfo], repo: Path, lines: _Lines) -> Objective:
    from trainlab.tasks import names as task_names

    if not isinstance(raw, dict):
        raise lines.error(("objective",), "missing or not a mapping: give {stage: train_classifier, metric: "
                          "val_accuracy}")
    _only(raw, {"stage", "metric", "direction"}, ("objective",), lines)
    by_name = {s.name: s for s in stages}
    stage = raw.get("stage")
    task = str(stage).removeprefix("train_")
    if stage not in by_name or task not in task_names():
        trainers = [s for s in by_name if s.removeprefix("train_") in task_names()]
        raise lines.error(("objective", "stage"), f"got {stage!r}; the training stages of dvc.yaml are "
                          f"{', '.join(trainers)}")
    history = [o for o in by_name[stage].outs if Path(o).name == HISTORY_FILE]
    if not history:
        raise lines.error(("objective", "stage"), f"{stage} writes no {HISTORY_FILE} (its per-epoch metrics)")
    metric = raw.get("metric")
    if not isinstance(metric, str) or not metric.startswith("val_"):
        raise lines.error(("objective", "metric"), f"got {metric!r}; a validation metric reported every epoch, "
                          "such as val_accuracy or val_loss")
    known = _history_columns(repo / history[0])
    if known and metric not in known:
        raise lines.error(("objective", "metric"), f"{history[0]} has no column {metric!r}; its validation "
                          f"metrics: {', '.join(c for c in known if c.startswith('val_'))}")
    direction = raw.get("direction", "minimize" if "loss" in metric else "maximize")
    if direction not in ("maximize", "minimize"):
        raise lines.error(("objective", "direction"), f"got {direction!r}; maximize or minimize")
    return Objective(stage, task, metric, direction, history[0])


def _history_columns(path: Path) -> list[str]:
    try:
        with open(path) as f:
            return f.readline().strip().split(",")
    except OSError:
        return []


def _targets(raw: Any, objective: Objective, stages: list[StageInfo], lines: _Lines) -> tuple[str, ...]:
    if raw is None:
        return (objective.stage,)
    names = {s.name for s in stages}
    if not isinstance(raw, list) or not raw or any(t not in names for t in raw):
        raise lines.error(("targets",), f"got {raw!r}; a list of stages of dvc.yaml ({', '.join(sorted(names))})")
    if objective.stage not in raw and not any(objective.stage in s.upstream for s in stages if s.name in raw):
        raise lines.error(("targets",), f"the objective's stage {objective.stage} would not run; add it")
    return tuple(raw)


def _pruner(raw: Mapping, lines: _Lines) -> dict[str, Any]:
    if not raw:
        return {"kind": "none"}
    kind = raw.get("kind", "median")
    if kind not in PRUNERS:
        raise lines.error(("pruner", "kind"), f"got {kind!r}; choose {', '.join(PRUNERS)}")
    _only({k: v for k, v in raw.items() if k != "kind"}, PRUNERS[kind], ("pruner",), lines)
    for key, value in raw.items():
        if key == "kind":
            continue
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        whole = key in ("startup_trials", "warmup_epochs")
        if not numeric or (whole and (not isinstance(value, int) or value < 0)):
            raise lines.error(("pruner", key), f"got {value!r}; expected a {'whole ' if whole else ''}number")
    if kind == "threshold" and "lower" not in raw and "upper" not in raw:
        raise lines.error(("pruner",), "a threshold pruner needs lower: or upper:")
    return {"kind": kind, **{k: v for k, v in raw.items() if k != "kind"}}


def _check_together(space: SearchSpace, repo: Path, lines: _Lines) -> None:
    """The fixed overrides with every param's first value: params.yaml's own cross-key checks pass."""
    overrides = dict(space.fixed)
    for p in space.params:
        overrides[p.key] = p.choices[0] if p.kind == "categorical" else p.low
    try:
        validated_params(repo, overrides)
    except ParamsError as exc:
        raise SearchSpaceError(f"{space.path}: params.yaml with this space's values is invalid: {exc}") from None
