"""The base of every params section: unknown keys are errors, values are checked on assignment too."""

from __future__ import annotations

from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def admits(annotation: Any, *kinds: type) -> bool:
    """Whether a field's type admits a value of one of `kinds`: the type itself, or a union, Optional, Annotated or
    Literal holding it (Any too)."""
    if annotation is Any or annotation in kinds:
        return True
    if get_origin(annotation) is Literal:
        return any(type(value) in kinds for value in get_args(annotation))
    return any(admits(arg, *kinds) for arg in get_args(annotation))


class Section(BaseModel):
    """A params section: unknown keys are errors, values are checked on assignment too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())

    # pydantic reads true as 1 and false as 0 for a number (`batch_size: true` would train on batches of one)
    @field_validator("*", mode="before")
    @classmethod
    def _no_true_or_false_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        annotation = cls.model_fields[info.field_name].annotation if info.field_name else bool
        if isinstance(value, bool) and admits(annotation, int, float) and not admits(annotation, bool):
            raise ValueError("true/false is not a number")
        return value
