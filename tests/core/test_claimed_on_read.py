"""``ClaimedOnRead``: a claim's jobs decoded when first read, once."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from ultimat3.jobs.core.model import ClaimedJob, ClaimRef
from ultimat3.jobs.core.protocol import ClaimedOnRead

AT = datetime(2026, 1, 1, tzinfo=UTC)


def claimed(job_id: str) -> ClaimedJob:
    return ClaimedJob(
        id=job_id,
        run_id=job_id,
        name="n",
        queue="q",
        input=None,
        idempotency_key=job_id,
        tenant_id=None,
        attempt=1,
        max_attempts=3,
        run_at=AT,
        created_at=AT,
        lease_until=AT,
        claim=ClaimRef("w", "c"),
    )


def test_counting_decodes_nothing_and_the_first_read_decodes_every_row_once() -> None:
    decoded: list[Sequence[str]] = []

    def decode(rows: Sequence[str]) -> list[ClaimedJob]:
        decoded.append(rows)
        return [claimed(row) for row in rows]

    jobs = ClaimedOnRead(["a", "b", "c"], decode)
    assert len(jobs) == 3
    assert bool(jobs)
    assert decoded == []
    assert jobs[1].id == "b"
    assert [job.id for job in jobs] == ["a", "b", "c"]
    assert [job.id for job in jobs[:2]] == ["a", "b"]
    assert decoded == [["a", "b", "c"]]
