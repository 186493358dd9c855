"""The JSON values drivers store: whatever shortcut a value takes, it reads back as the round trip
through JSON text would give it."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from ultimat3.jobs.core.jsonvalue import (
    json_roundtrip,
    json_text,
    storable_form,
    storable_text,
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


def through_text(value: Any) -> Any:
    return json.loads(json.dumps(value, allow_nan=False))


@given(json_values)
def test_a_json_value_reads_back_as_its_text_would(value: Any) -> None:
    assert json_roundtrip(value) == through_text(value)
    assert json.loads(json_text(json_roundtrip(value))) == through_text(value)


@given(st.dictionaries(st.text(), scalars, max_size=6))
def test_a_flat_dict_comes_back_as_a_copy(value: dict[str, Any]) -> None:
    copy = json_roundtrip(value)
    assert copy == value
    assert copy is not value


class Color(Enum):
    RED = "red"


class Level(IntEnum):
    HIGH = 3


def test_members_of_enums_become_their_values() -> None:
    stored = json_roundtrip({"color": Color.RED, "level": Level.HIGH})
    assert stored == {"color": "red", "level": 3}
    assert type(stored["level"]) is int


def test_keys_that_are_not_strings_become_strings() -> None:
    assert json_roundtrip({1: "a"}) == {"1": "a"}


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_float_json_cannot_hold_is_refused(bad: float) -> None:
    with pytest.raises(ValueError):
        json_roundtrip({"x": bad})
    with pytest.raises(ValueError):
        json_roundtrip({"x": bad})
    with pytest.raises(ValueError):
        json_text({"x": bad})


class Point(BaseModel):
    x: float
    tags: tuple[str, ...]


@dataclass
class Box:
    size: int
    items: tuple[int, ...]


def test_models_and_dataclasses_read_back_as_their_json_form() -> None:
    assert json_roundtrip(Point(x=1, tags=("a",))) == {"x": 1.0, "tags": ["a"]}
    assert json_roundtrip(Point(x=1, tags=("a",))) == {"x": 1.0, "tags": ["a"]}
    assert json_roundtrip(Box(size=2, items=(1, 2))) == {"size": 2, "items": [1, 2]}


def test_storable_form_spells_out_what_no_driver_stores() -> None:
    assert storable_form("plain é ✓") == "plain é ✓"
    assert storable_form("a\x00b") == "a\\x00b"
    assert storable_form("lone \udcff") == "lone \\udcff"


@given(st.text())
def test_storable_form_is_always_storable_and_keeps_storable_text(text: str) -> None:
    stored = storable_form(text)
    assert storable_text(stored)
    if storable_text(text):
        assert stored == text
