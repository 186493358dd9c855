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
from .jsonvalue import to_json
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
                f"input does not parse as {self.type_name}: {exc}",
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
        """The JSON form of a value ``parse`` answered: what the row stores and a claim parses."""
        try:
            return to_json(value)
        except (TypeError, ValueError) as exc:
            raise JobInputInvalidError(
                f"input of type {self.type_name} cannot be stored as JSON: {exc}",
                meta={"input_type": self.type_name},
            ) from exc
