"""Param overrides from the command line (`classifier.lr=0.01`) and sweep grids (`classifier.lr=0.001,0.003`)."""

from __future__ import annotations

import copy
import itertools
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from trainlab.core.config import Params, load_params
from trainlab.core.errors import ParamsError

PARAMS_FILE = "params.yaml"


def parse_value(text: str) -> Any:
    """A YAML scalar: `0.01` -> 0.01, `true` -> True, `null` -> None, anything else stays a string."""
    try:
        return yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        return text


def _split(assignment: str) -> tuple[str, str]:
    key, sep, value = assignment.partition("=")
    if not sep or not key.strip() or not value.strip():
        raise ParamsError(f"override {assignment!r}: expected KEY=VALUE, for example classifier.lr=0.01")
    return key.strip(), value.strip()


def parse_overrides(assignments: Sequence[str]) -> dict[str, Any]:
    """`["classifier.lr=0.01", "base.seed=1"]` -> `{"classifier.lr": 0.01, "base.seed": 1}`."""
    overrides: dict[str, Any] = {}
    for assignment in assignments:
        key, value = _split(assignment)
        overrides[key] = parse_value(value)
    return overrides


def parse_grid(assignments: Sequence[str]) -> dict[str, list[Any]]:
    """`["classifier.lr=0.001,0.003", "base.seed=1,2"]` -> `{"classifier.lr": [0.001, 0.003], "base.seed": [1, 2]}`."""
    grid: dict[str, list[Any]] = {}
    for assignment in assignments:
        key, values = _split(assignment)
        if key in grid:
            raise ParamsError(f"--grid {key} given twice; list all its values once: {key}=a,b,c")
        grid[key] = [parse_value(v.strip()) for v in values.split(",") if v.strip()]
    return grid


def expand_grid(grid: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Every combination of the grid's values, in order (the last key varies fastest)."""
    if not grid:
        raise ParamsError("the sweep grid is empty; give at least one --grid KEY=V1,V2")
    for key, values in grid.items():
        if not values:
            raise ParamsError(f"--grid {key}: no values")
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def deep_merge(base: dict, extra: Mapping[str, Any]) -> dict:
    """`extra` merged into the nested params dict `base` (in place, and returned); values are copied."""
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            deep_merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


def validated_params(root: str | os.PathLike, overrides: Mapping[str, Any] | None = None) -> Params:
    """params.yaml of `root` with `overrides` applied and validated (ParamsError names the bad key)."""
    return load_params(Path(root) / PARAMS_FILE, dict(overrides or {}))


def describe(overrides: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in overrides.items()) or "(no overrides)"
