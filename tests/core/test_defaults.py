"""One source of defaults: params.yaml holds every key of the schema, each with the schema's default as its value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from trainlab.core.config import Params

REPO = Path(__file__).resolve().parents[2]


def leaves(tree: dict, prefix: str = "") -> dict[str, Any]:
    """The dotted keys of a nested mapping and their values (lists are values, mappings are sections)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(leaves(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def nest(flat: dict[str, Any]) -> dict:
    tree: dict = {}
    for dotted, value in flat.items():
        *parents, leaf = dotted.split(".")
        node = tree
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return tree


def schema_defaults() -> dict[str, Any]:
    """What each key becomes when params.yaml leaves it out: every section given, every key of it missing."""
    sections = {dotted.rpartition(".")[0] for dotted in leaves(Params().model_dump(mode="json"))}
    skeleton: dict = {}
    for section in sections:
        node = skeleton
        for key in section.split("."):
            node = node.setdefault(key, {})
    return leaves(Params.model_validate(skeleton).model_dump(mode="json"))


def differences(raw: dict) -> list[str]:
    """Each key of the schema missing from the params file, each key of the file not in the schema, and each value
    (once validated, so 1 and 1.0 of a float key agree) that differs from the schema's default."""
    defaults, written = schema_defaults(), leaves(raw)
    found = [f"{key}: in the schema (default {defaults[key]!r}) but not in params.yaml" for key in defaults
             if key not in written]
    found += [f"{key}: in params.yaml ({written[key]!r}) but not in the schema" for key in written
              if key not in defaults]
    known = {key: value for key, value in written.items() if key in defaults}
    validated = leaves(Params.model_validate(nest(known)).model_dump(mode="json"))
    found += [f"{key}: the schema's default is {defaults[key]!r}, params.yaml's value {written[key]!r}"
              for key in known if defaults[key] != validated[key]]
    return found


def test_params_yaml_and_the_schema_defaults_agree_key_for_key():
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    found = differences(raw)
    assert not found, "params.yaml and trainlab/core/config.py disagree:\n" + "\n".join(found)
    # a whole section left out gets the same values as each of its keys left out
    assert leaves(Params().model_dump(mode="json")) == schema_defaults()


def test_the_check_names_each_difference_in_either_direction():
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    del raw["classifier"]["lr"], raw["data"]["segmentation"]["image_size"]
    raw["classifier"]["lrr"] = 0.1
    raw["segmenter"]["min_steps"] = raw["segmenter"]["min_steps"] + 1
    raw["text"]["char_ngrams"] = [3, 4]
    raw["evaluate"]["tta"] = 1  # validates to True: a different value from the default false
    default_lr, steps = Params().classifier.lr, raw["segmenter"]["min_steps"]
    assert sorted(differences(raw)) == sorted([
        f"classifier.lr: in the schema (default {default_lr!r}) but not in params.yaml",
        "data.segmentation.image_size: in the schema (default 'auto') but not in params.yaml",
        "classifier.lrr: in params.yaml (0.1) but not in the schema",
        f"segmenter.min_steps: the schema's default is {steps - 1}, params.yaml's value {steps}",
        "text.char_ngrams: the schema's default is [3, 5], params.yaml's value [3, 4]",
        "evaluate.tta: the schema's default is False, params.yaml's value 1",
    ])
