"""The model registry's conventions: a task's registered model name and the `champion` alias, which a model's first
registered version takes (later ones only through `python -m pipelines.compare --promote` or the retraining job)."""

from __future__ import annotations

from typing import Any

from trainlab.tracking.retry import retry

CHAMPION = "champion"


def model_name(task: str) -> str:
    """The registered model of a task: ``trainlab-<task>``."""
    return f"trainlab-{task}"


def crown_if_none(client: Any, name: str, version: str) -> bool:
    """Point `champion` at `version` of model `name` when the model has no champion yet; True when it did.

    So `models:/<name>@champion` answers after the first `dvc repro`; a later version moves the alias only when
    compare/promote finds it better. Two first versions registered at once may both find no champion: the later
    write wins, and a champion exists either way."""
    aliases = retry(client.get_registered_model, name).aliases or {}
    if CHAMPION in aliases:
        return False
    retry(client.set_registered_model_alias, name, CHAMPION, str(version))
    print(f"{name} v{version} is the {CHAMPION} (the model had none): models:/{name}@{CHAMPION}", flush=True)
    return True
