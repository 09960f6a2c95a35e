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


def item_types(annotation: Any) -> list[Any]:
    """The element types of the list or tuple types a field's type holds (`tuple[int, int] | None`: [int, int])."""
    if get_origin(annotation) in (list, tuple):
        return [arg for arg in get_args(annotation) if arg is not Ellipsis]
    return [item for arg in get_args(annotation) for item in item_types(arg)]


def true_or_false_for_a_number(annotation: Any, value: Any) -> bool:
    """Whether `value` holds YAML's true/false where the type wants a number (pydantic would read 1 or 0)."""
    if isinstance(value, bool):
        return admits(annotation, int, float) and not admits(annotation, bool)
    if isinstance(value, (list, tuple)) and any(isinstance(item, bool) for item in value):
        items = item_types(annotation)
        return any(admits(t, int, float) for t in items) and not any(admits(t, bool) for t in items)
    return False


class Section(BaseModel):
    """A params section: unknown keys are errors, values are checked on assignment too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())

    # pydantic reads true as 1 and false as 0 for a number (`batch_size: true` would train on batches of one)
    @field_validator("*", mode="before")
    @classmethod
    def _no_true_or_false_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        if info.field_name and true_or_false_for_a_number(cls.model_fields[info.field_name].annotation, value):
            raise ValueError("true/false is not a number")
        return value
