"""A job's declared input: parsed at enqueue, stored as JSON, parsed again at every claim.

Core does not import pydantic: a model is recognised by ``model_validate``/``model_dump``. A
dataclass is built from its fields; ``None`` declares a job that takes no input; ``dict`` takes any
JSON object.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Generic, TypeVar, cast

from .errors import JobDeclarationInvalidError, JobInputInvalidError
from .jsonvalue import json_roundtrip
from .model import JsonValue

__all__ = ["InputCodec"]

InputT = TypeVar("InputT")


class InputCodec(Generic[InputT]):
    """Parse and dump one declared input type."""

    def __init__(self, declared: type[InputT] | None) -> None:
        self.declared = declared
        if declared is None or declared is dict:
            self.kind = "none" if declared is None else "dict"
        elif callable(getattr(declared, "model_validate", None)):
            self.kind = "pydantic"
        elif dataclasses.is_dataclass(declared):
            self.kind = "dataclass"
        else:
            raise JobDeclarationInvalidError(
                f"input={declared!r} is not a pydantic model, a dataclass, dict or None",
                meta={"field": "input"},
            )

    @property
    def type_name(self) -> str | None:
        return None if self.declared is None else self.declared.__name__

    def parse(self, raw: Any) -> InputT:
        """The typed input from a stored (or caller-supplied) value; ``X_VALIDATION`` if it
        does not fit."""
        try:
            value: InputT = self._parse(raw)
        except JobInputInvalidError:
            raise
        except Exception as exc:
            raise JobInputInvalidError(
                f"input does not parse as {self.type_name}: {_without_values(exc)}",
                meta={"input_type": self.type_name},
            ) from exc
        return value

    def _parse(self, raw: Any) -> Any:
        if self.kind == "none":
            if raw is not None:
                raise ValueError("this job takes no input; pass None")
            return None
        if self.kind == "dict":
            # A dict (every claimed row's input) skips the ABC check, dearer than the copy.
            if type(raw) is not dict and not isinstance(raw, Mapping):
                raise ValueError(f"expected a JSON object, got {type(raw).__name__}")
            return dict(raw)
        assert self.declared is not None
        if isinstance(raw, self.declared):
            return raw
        if self.kind == "pydantic":
            return cast(Any, self.declared).model_validate(raw)
        if not isinstance(raw, Mapping):
            raise ValueError(f"expected a JSON object, got {type(raw).__name__}")
        fields = {f.name for f in dataclasses.fields(cast(Any, self.declared)) if f.init}
        unknown = set(raw) - fields
        if unknown:
            raise ValueError(f"unknown field(s) {sorted(unknown)}")
        return self.declared(**raw)

    def dump(self, value: InputT) -> JsonValue:
        """The JSON form of a value ``parse`` answered: what the row stores and a claim parses.
        A typed input must read back from it as it was given (a model validates again, a
        dataclass's fields come back equal): refused here, at the enqueue, rather than at the
        first claim, where the row would dead-letter without its body running."""
        try:
            if self.kind == "pydantic":  # by alias: what model_validate reads
                stored = json_roundtrip(cast(Any, value).model_dump(mode="json", by_alias=True))
            else:
                stored = json_roundtrip(value)
        except (TypeError, ValueError) as exc:
            raise JobInputInvalidError(
                f"input of type {self.type_name} cannot be stored as JSON: {exc}",
                meta={"input_type": self.type_name},
            ) from exc
        if self.kind in ("pydantic", "dataclass"):
            self._reads_back(value, stored)
        return stored

    def _reads_back(self, value: InputT, stored: JsonValue) -> None:
        try:
            again = self._parse(stored)
        except Exception as exc:
            raise JobInputInvalidError(
                f"input of type {self.type_name} does not parse back from its stored JSON form, "
                f"as every claim parses it: {_without_values(exc)}",
                meta={"input_type": self.type_name},
            ) from exc
        if self.kind == "dataclass":
            names = [f.name for f in dataclasses.fields(cast(Any, value))]
            if [getattr(again, n) for n in names] != [getattr(value, n) for n in names]:
                raise JobInputInvalidError(
                    f"input of type {self.type_name} reads back from its stored JSON form with "
                    "other values: a dataclass's fields come back as JSON values (a nested "
                    "dataclass as a dict, a datetime, UUID or enum as text, a tuple as a list); "
                    "declare a pydantic model for typed fields",
                    meta={"input_type": self.type_name},
                )


def _without_values(error: BaseException) -> str:
    """What a parse failure says, without the values it failed on: a pydantic error quotes the
    input, secrets and all, and the message is stored as the row's ``last_error``."""
    errors = getattr(error, "errors", None)
    if not callable(errors):
        return str(error)
    try:
        found = errors(include_input=False, include_url=False)
    except TypeError:
        return type(error).__name__
    return "; ".join(
        f"{'.'.join(str(part) for part in item.get('loc', ())) or 'input'}: {item.get('msg', '')}"
        for item in found
    )
