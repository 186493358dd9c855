"""The operator surface's edges the conformance suite does not reach."""

from __future__ import annotations

import pytest

from ultimat3.jobs.core.errors import JobPageInvalidError
from ultimat3.jobs.core.model import JobFilter
from ultimat3.jobs.pg import PostgresJobDriver

pytestmark = pytest.mark.pg


@pytest.mark.parametrize("which", ["after", "before"])
async def test_an_empty_cursor_is_refused_as_an_invalid_page(
    driver: PostgresJobDriver, which: str
) -> None:
    with pytest.raises(JobPageInvalidError):
        await driver.introspect.list(JobFilter(**{which: ""}))
