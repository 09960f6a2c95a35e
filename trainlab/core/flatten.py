"""Nested mappings (and pydantic models) as flat keys: the names MLflow params and metrics go by."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

METRIC_KEY_UNSAFE = re.compile(r"[^\w\-./ ]")  # characters an MLflow metric name cannot hold


def flatten(tree: Mapping[str, Any] | BaseModel, sep: str = ".", prefix: str = "") -> dict[str, Any]:
    """Every leaf of a nested mapping under its joined key (``classifier.lr``); pydantic models are mappings."""
    if isinstance(tree, BaseModel):
        tree = tree.model_dump(mode="json")
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        joined = f"{prefix}{sep}{key}" if prefix else str(key)
        if isinstance(value, BaseModel):
            value = value.model_dump(mode="json")
        if isinstance(value, Mapping):
            flat.update(flatten(value, sep, joined))
        else:
            flat[joined] = value
    return flat


def numbers(tree: Mapping[str, Any], sep: str = ".", safe_keys: bool = False) -> dict[str, float]:
    """The numeric leaves (not booleans) as floats, for MLflow metrics; `safe_keys` replaces the characters a
    metric name cannot hold with "_"."""
    return {(METRIC_KEY_UNSAFE.sub("_", k) if safe_keys else k): float(v) for k, v in flatten(tree, sep).items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def strings(tree: Mapping[str, Any] | BaseModel) -> dict[str, str]:
    """Every leaf as a string, for MLflow params: lists as JSON."""
    return {k: stringify(v) for k, v in flatten(tree).items()}


def stringify(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        try:
            return json.dumps(list(value))
        except TypeError:
            return str(list(value))
    return str(value)
