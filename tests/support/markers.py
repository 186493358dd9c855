"""Marking a whole test folder, for the folders whose every test needs one server."""

from __future__ import annotations

from pathlib import Path

import pytest


def mark_folder(items: list[pytest.Item], conftest: str, marker: pytest.MarkDecorator) -> None:
    """Add ``marker`` to each of ``items`` collected under the folder of ``conftest``."""
    here = Path(conftest).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(marker)
