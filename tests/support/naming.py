"""Durable names for the jobs tests declare inside test functions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def job_name_of(body: Callable[..., Any]) -> str:
    """The body's module and qualified name: unique per test, where short names like ``ok``
    repeat across tests and would route one test's rows to another test's body."""
    return f"{body.__module__}:{body.__qualname__}"
