"""The shipped conformance suite fails a driver that carries one deliberate bug.

Each broken driver is the memory driver with a single rule bent. For each, the suite's own tests
for that rule are run directly against it and must fail on one of their own checks (an ``assert``
or ``pytest.raises`` in the test's body, not a crash or a helper's), and the same tests pass on
the memory driver itself; the rules the stateful test exercises must also be caught by it.
"""

from __future__ import annotations

import dataclasses
import traceback
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from ultimat3.jobs.core import (
    AckOptions,
    BulkFilter,
    BulkResult,
    ClaimRef,
    Enqueued,
    EnqueueRequest,
    FrozenClock,
    JobFilter,
    JobPage,
    JobState,
    NackOptions,
    Progress,
    StepRecord,
    memory_event_bus,
)
from ultimat3.jobs.core.constants import MAX_JOB_PAGE
from ultimat3.jobs.core.memory import MemoryIntrospection, MemoryJobDriver, MemoryLeaseStore
from ultimat3.jobs.core.memory.state import Row
from ultimat3.jobs.core.model import ClaimedJob, JsonValue
from ultimat3.jobs.core.protocol import ClaimBatch
from ultimat3.jobs.testing import (
    ConformanceTarget,
    TargetFactory,
    check_against_reference,
    job_driver_conformance,
    open_conformance,
)
from ultimat3.jobs.testing import conformance as suite_package

# -- the bugs ---------------------------------------------------------------------------------


class SettleIgnoresTheClaim(MemoryJobDriver):
    """Any write about a running row lands, whoever claimed it."""

    def _owned(self, job_id: str, ref: ClaimRef) -> Row | None:
        row = self._state.rows.get(job_id)
        return row if row is not None and row.state is JobState.RUNNING else None


def _as_sql_without_json(value: JsonValue) -> Any:
    """``value`` as a store with no JSON type gives it back: booleans as 0/1, floats as
    decimals. ``==`` cannot tell either from the original."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, list):
        return [_as_sql_without_json(item) for item in value]
    if isinstance(value, dict):
        return {key: _as_sql_without_json(item) for key, item in value.items()}
    return value


class StepsLoseTheirTypes(MemoryJobDriver):
    """A step's output replays with other types: True as 1, 2.5 as Decimal("2.5")."""

    async def save_step(self, job_id: str, ref: ClaimRef, run_id: str, step: StepRecord) -> bool:
        lossy = dataclasses.replace(step, output=_as_sql_without_json(step.output))
        return await super().save_step(job_id, ref, run_id, lossy)


class DedupeIgnoresTheTenant(MemoryJobDriver):
    """One live row per (name, key) across every tenant."""

    def _insert(self, request: EnqueueRequest) -> Enqueued:
        if request.id not in self._state.rows:
            for row in self._state.rows.values():
                same = (row.name, row.idempotency_key) == (request.name, request.idempotency_key)
                if same and row.live:
                    return Enqueued(row.id, row.run_id, deduped=True)
        return super()._insert(request)


class ClaimHandsOutLeasedRows(MemoryJobDriver):
    """A running row is claimable whether or not its lease lapsed."""

    async def claim(
        self,
        *,
        worker_id: str,
        slots: Mapping[str, int],
        visibility_timeout: float,
        drop_exhausted: Collection[str] = (),
    ) -> ClaimBatch:
        now = self.clock.now()
        for row in self._state.rows.values():
            if row.state is JobState.RUNNING and row.lease_until is not None:
                row.lease_until = min(row.lease_until, now)
        return await super().claim(
            worker_id=worker_id,
            slots=slots,
            visibility_timeout=visibility_timeout,
            drop_exhausted=drop_exhausted,
        )


class NackForgetsTheBackoff(MemoryJobDriver):
    """A retried row is due again at once, whatever ``run_at`` the nack named."""

    async def nack(self, job_id: str, options: NackOptions) -> bool:
        return await super().nack(job_id, dataclasses.replace(options, run_at=None))


class NackAlwaysCountsTheAttempt(MemoryJobDriver):
    """``count_attempt=False`` is ignored: a suspension burns an attempt."""

    async def nack(self, job_id: str, options: NackOptions) -> bool:
        return await super().nack(job_id, dataclasses.replace(options, count_attempt=True))


class FutureRowsEnqueueReady(MemoryJobDriver):
    """A row due later is stored ready instead of delayed."""

    def _insert(self, request: EnqueueRequest) -> Enqueued:
        queued = super()._insert(request)
        row = self._state.rows[queued.id]
        if not queued.deduped and row.state is JobState.DELAYED:
            row.state = JobState.READY
        return queued


class ClaimHandsOutExhaustedRows(MemoryJobDriver):
    """A lease that lapsed on the final attempt is handed out again instead of buried."""

    async def claim(
        self,
        *,
        worker_id: str,
        slots: Mapping[str, int],
        visibility_timeout: float,
        drop_exhausted: Collection[str] = (),
    ) -> ClaimBatch:
        now = self.clock.now()
        for row in self._state.rows.values():
            lapsed = row.lease_until is not None and row.lease_until <= now
            if row.state is JobState.RUNNING and lapsed and row.attempt >= row.max_attempts:
                row.max_attempts = row.attempt + 1
        return await super().claim(
            worker_id=worker_id,
            slots=slots,
            visibility_timeout=visibility_timeout,
            drop_exhausted=drop_exhausted,
        )


class BurialIgnoresDropExhausted(MemoryJobDriver):
    """Every buried row goes dead, even for jobs the claimant named in ``drop_exhausted``."""

    async def claim(
        self,
        *,
        worker_id: str,
        slots: Mapping[str, int],
        visibility_timeout: float,
        drop_exhausted: Collection[str] = (),
    ) -> ClaimBatch:
        return await super().claim(
            worker_id=worker_id, slots=slots, visibility_timeout=visibility_timeout
        )


class ClaimForgetsTheSteps(MemoryJobDriver):
    """A claimed job carries none of its run's stored steps."""

    def _claimed(self, row: Row) -> ClaimedJob:
        return dataclasses.replace(super()._claimed(row), steps={})


class AckForgetsTheSteps(MemoryJobDriver):
    """A finished run's stored steps are thrown away: the operator's view of them is lost."""

    async def ack(self, job_id: str, options: AckOptions) -> bool:
        landed = await super().ack(job_id, options)
        if landed:
            self._state.steps.pop(self._state.rows[job_id].run_id, None)
        return landed


class AckAgainCountsAgain(MemoryJobDriver):
    """An ack sent again under the claim that finished its row is counted a second time."""

    async def ack(self, job_id: str, options: AckOptions) -> bool:
        first = self._owned(job_id, options.ref) is not None
        landed = await super().ack(job_id, options)
        if landed and not first:
            self._state.count(self._state.rows[job_id].name, "done", options.duration_ms)
        return landed


class AckAgainUnderAnyClaim(MemoryJobDriver):
    """An ack of a done row answers True whichever claim it carries."""

    async def ack(self, job_id: str, options: AckOptions) -> bool:
        row = self._state.rows.get(job_id)
        if row is not None and row.state is JobState.DONE:
            return True
        return await super().ack(job_id, options)


class ClaimIgnoresPauses(MemoryJobDriver):
    """A paused queue is claimed like any other."""

    async def claim(
        self,
        *,
        worker_id: str,
        slots: Mapping[str, int],
        visibility_timeout: float,
        drop_exhausted: Collection[str] = (),
    ) -> ClaimBatch:
        paused = set(self._state.paused_queues)
        self._state.paused_queues.clear()
        try:
            return await super().claim(
                worker_id=worker_id,
                slots=slots,
                visibility_timeout=visibility_timeout,
                drop_exhausted=drop_exhausted,
            )
        finally:
            self._state.paused_queues |= paused


class _HoldersByName(MemoryLeaseStore):
    async def holders(self, key: str) -> list[str]:
        return sorted(await super().holders(key))


class LeaseHoldersByName(MemoryJobDriver):
    """The lease store lists holders by name instead of in slot order."""

    def __init__(self, *, clock: FrozenClock) -> None:
        super().__init__(clock=clock)
        self._leases = _HoldersByName(clock)


class _UnboundedList(MemoryIntrospection):
    async def list(self, filter: JobFilter) -> JobPage:
        limit = filter.limit if filter.limit is not None else None
        bounded = dataclasses.replace(filter, limit=min(limit, MAX_JOB_PAGE) if limit else None)
        return await super().list(bounded)


class ListIgnoresThePageBound(MemoryJobDriver):
    """``list`` quietly clamps a limit over ``MAX_JOB_PAGE`` instead of refusing it."""

    def __init__(self, *, clock: FrozenClock) -> None:
        super().__init__(clock=clock)
        self._introspect = _UnboundedList(self._state)


class _OverstatedRemaining(MemoryIntrospection):
    async def remove_many(self, filter: BulkFilter) -> BulkResult:
        result = await super().remove_many(filter)
        return BulkResult(result.affected, result.remaining + result.affected)


class RemoveManyOverstatesRemaining(MemoryJobDriver):
    """``remove_many`` counts the rows it just removed as still remaining."""

    def __init__(self, *, clock: FrozenClock) -> None:
        super().__init__(clock=clock)
        self._introspect = _OverstatedRemaining(self._state)


class _ProgressWhenever(MemoryIntrospection):
    async def record_progress(self, job_id: str, ref: ClaimRef, progress: Progress) -> bool:
        row = self._state.rows.get(job_id)
        if row is None:
            return False
        row.progress = progress
        return True


class ProgressIgnoresTheClaim(MemoryJobDriver):
    """A progress report lands on its row whoever holds it, and after the run ended."""

    def __init__(self, *, clock: FrozenClock) -> None:
        super().__init__(clock=clock)
        self._introspect = _ProgressWhenever(self._state)


# -- running the suite against them -----------------------------------------------------------


def _target(driver_type: type[MemoryJobDriver]) -> TargetFactory:
    @asynccontextmanager
    async def target(
        clock: FrozenClock, request: pytest.FixtureRequest
    ) -> AsyncIterator[ConformanceTarget]:
        yield ConformanceTarget(driver=driver_type(clock=clock), events=memory_event_bus(clock))

    target.__name__ = driver_type.__name__
    return target


_FAILED_CHECKS = (AssertionError, pytest.fail.Exception)
"""How a test fails a driver: an ``assert``, or ``pytest.raises``/``pytest.fail``."""

_SUITE_DIR = str(Path(suite_package.__file__).parent)


async def _failure(
    driver_type: type[MemoryJobDriver], test: str, request: pytest.FixtureRequest
) -> BaseException | None:
    """The failed check the suite's ``test`` stops on against ``driver_type``, None when it
    passes. Anything else it raises — a crash, a skip — propagates: a suite test that blows up
    on a driver has caught nothing."""
    factory = _target(driver_type)
    suite = job_driver_conformance(factory)
    async with open_conformance(factory, request) as jobs:
        try:
            await getattr(suite(), test)(jobs)
        except _FAILED_CHECKS as failed:
            _insist_the_test_itself_failed(test, driver_type, failed)
            return failed
        except pytest.skip.Exception as skipped:
            raise AssertionError(f"{test} skipped on {driver_type.__name__}: {skipped}") from None
    return None


def _insist_the_test_itself_failed(
    test: str, driver_type: type[MemoryJobDriver], failed: BaseException
) -> None:
    """A check that failed in a helper of the suite (``claim_one`` finding no job) is not the
    rule's own check: the innermost suite frame must be the test's."""
    suite_frames = [
        frame.f_code.co_name
        for frame, _ in traceback.walk_tb(failed.__traceback__)
        if frame.f_code.co_filename.startswith(_SUITE_DIR)
    ]
    if not suite_frames or suite_frames[-1] != test:
        raise AssertionError(
            f"{test} failed on {driver_type.__name__} outside its own checks "
            f"(in {suite_frames[-1:] or 'no suite code'}): {failed}"
        ) from failed


CAUGHT_BY: Sequence[tuple[type[MemoryJobDriver], Sequence[str]]] = [
    (AckAgainCountsAgain, ["test_an_ack_sent_again_answers_true_and_changes_nothing"]),
    (AckAgainUnderAnyClaim, ["test_an_ack_under_a_claim_another_ack_finished_answers_false"]),
    (
        SettleIgnoresTheClaim,
        [
            "test_ack_under_a_stale_claim_answers_false_and_changes_nothing",
            "test_ack_is_fenced_on_the_token_not_only_the_worker",
            "test_nack_under_a_stale_claim_answers_false_and_changes_nothing",
            "test_heartbeat_under_a_stale_claim_answers_false_and_changes_nothing",
            "test_save_step_under_a_stale_claim_stores_nothing",
        ],
    ),
    (
        DedupeIgnoresTheTenant,
        ["test_dedupe_is_per_tenant", "test_a_none_tenant_is_its_own_tenant"],
    ),
    (
        ClaimHandsOutLeasedRows,
        [
            "test_a_claimed_row_is_invisible_while_its_lease_holds",
            "test_each_row_goes_to_one_claim",
        ],
    ),
    (
        NackForgetsTheBackoff,
        [
            "test_a_plain_nack_is_ready_again_at_its_run_at",
            "test_park_suspends_the_row_until_its_run_at",
        ],
    ),
    (
        NackAlwaysCountsTheAttempt,
        [
            "test_an_uncounted_nack_hands_the_attempt_back",
            "test_a_handed_back_attempt_counts_nothing",
        ],
    ),
    (FutureRowsEnqueueReady, ["test_a_row_due_later_is_delayed"]),
    (
        ClaimHandsOutExhaustedRows,
        ["test_a_lapsed_final_attempt_is_buried_not_handed_out", "test_a_burial_counts_dead"],
    ),
    (BurialIgnoresDropExhausted, ["test_drop_exhausted_buries_the_named_jobs_failed"]),
    (ClaimForgetsTheSteps, ["test_a_saved_step_comes_back_on_the_next_claim"]),
    (StepsLoseTheirTypes, ["test_step_outputs_round_trip_as_json"]),
    (
        ClaimIgnoresPauses,
        ["test_a_paused_queue_is_not_claimed", "test_a_paused_queue_buries_nothing"],
    ),
    (LeaseHoldersByName, ["test_holders_are_listed_in_slot_order"]),
    (ListIgnoresThePageBound, ["test_a_limit_over_the_maximum_is_refused"]),
    (RemoveManyOverstatesRemaining, ["test_remove_many_moves_at_most_the_bound"]),
    (
        ProgressIgnoresTheClaim,
        [
            "test_progress_under_a_stale_claim_answers_false_and_changes_nothing",
            "test_progress_after_the_settle_answers_false",
            "test_a_cancelled_run_cannot_settle_renew_or_report",
        ],
    ),
]


@pytest.mark.parametrize(("broken", "tests"), CAUGHT_BY, ids=[b.__name__ for b, _ in CAUGHT_BY])
async def test_the_suite_fails_the_broken_driver(
    broken: type[MemoryJobDriver], tests: Sequence[str], request: pytest.FixtureRequest
) -> None:
    passed = [test for test in tests if await _failure(broken, test, request) is None]
    assert passed == [], f"{broken.__name__} passed {passed}"


@pytest.mark.parametrize(("broken", "tests"), CAUGHT_BY, ids=[b.__name__ for b, _ in CAUGHT_BY])
async def test_the_same_tests_pass_on_the_memory_driver(
    broken: type[MemoryJobDriver], tests: Sequence[str], request: pytest.FixtureRequest
) -> None:
    failed = {
        test: failure
        for test in tests
        if (failure := await _failure(MemoryJobDriver, test, request))
    }
    assert failed == {}


CAUGHT_BY_THE_STATEFUL_TEST = [
    SettleIgnoresTheClaim,
    DedupeIgnoresTheTenant,
    ClaimHandsOutLeasedRows,
    NackForgetsTheBackoff,
    NackAlwaysCountsTheAttempt,
    FutureRowsEnqueueReady,
    ClaimHandsOutExhaustedRows,
    BurialIgnoresDropExhausted,
    ClaimForgetsTheSteps,
    AckForgetsTheSteps,
    ClaimIgnoresPauses,
]


@pytest.mark.parametrize("broken", CAUGHT_BY_THE_STATEFUL_TEST, ids=lambda b: b.__name__)
def test_the_stateful_test_fails_the_broken_driver(
    broken: type[MemoryJobDriver], request: pytest.FixtureRequest
) -> None:
    with pytest.raises(AssertionError):
        check_against_reference(
            _target(broken), request, max_examples=500, shrink=False, derandomize=True
        )
