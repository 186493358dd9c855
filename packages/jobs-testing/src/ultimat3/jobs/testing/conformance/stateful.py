"""The stateful conformance test: random protocol operations, on the driver and on the model.

Hypothesis drives sequences of enqueues (colliding keys and tenants, reused ids), claims by
several workers with small slot counts, acks, nacks of every kind and heartbeats under fresh and
stale claims, step writes, clock advances past visibility timeouts (so final attempts get
buried), and — when the driver has an operator surface — queue pauses and resumes. Every answer
is compared with ``ReferenceQueue``'s, and after every operation the whole observable state too
(stats; with an operator surface also every row, each row's stored steps, the counters and the
paused queues). The first difference fails the test, and Hypothesis shrinks it to a short script.

Budget: ``UJOBS_CONFORMANCE_EXAMPLES`` sequences (default 25) of up to
``UJOBS_CONFORMANCE_STEPS`` operations (default 30). Raise both for a soak run.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Coroutine, Sequence
from contextlib import AsyncExitStack, suppress
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from ultimat3.jobs.core import (
    AckOptions,
    ClaimedJob,
    EnqueueRequest,
    JobIntrospection,
    JobRow,
    JobState,
    NackOptions,
    StepKind,
    StepRecord,
    new_id,
    without_done,
)
from ultimat3.jobs.core.model import STEP_KINDS

from ..reference import ReferenceQueue
from .target import Conformance, TargetFactory, open_conformance

__all__ = [
    "DEFAULT_EXAMPLES",
    "DEFAULT_STEPS",
    "EXAMPLES_ENV",
    "STEPS_ENV",
    "StatefulRules",
    "check_against_reference",
]

T = TypeVar("T")

EXAMPLES_ENV = "UJOBS_CONFORMANCE_EXAMPLES"
STEPS_ENV = "UJOBS_CONFORMANCE_STEPS"
DEFAULT_EXAMPLES = 25
DEFAULT_STEPS = 30

# Small pools, so operations collide: two names x three tenants x three keys, two queues.
_NAMES = ("alpha", "beta")
_TENANTS = (None, "org-1", "org-2")
_KEYS = ("k1", "k2", "k3")
_QUEUES = ("q1", "q2")
_WORKERS = ("w1", "w2", "w3")
_DELAYS = (-3, 0, 0, 0, 4, 20)
_VISIBILITY = (5, 5, 10, 30)
_ADVANCES = (1, 4, 10, 31)
_NACK_KINDS = (
    # (dead_letter, fail, park): a plain retry and a park most often.
    (False, False, False),
    (False, False, False),
    (False, False, False),
    (False, False, True),
    (False, False, True),
    (True, False, False),
    (False, True, False),
    (True, True, True),
)
_LONG_AGO = timedelta(days=400)

_request_specs = st.tuples(
    st.sampled_from(_NAMES),
    st.sampled_from(_TENANTS),
    st.sampled_from(_KEYS),
    st.sampled_from(_QUEUES),
    st.sampled_from(_DELAYS),
    st.sampled_from((1, 1, 2, 3)),
    st.sampled_from((False, False, False, True)),
)
RequestSpec = tuple[str, str | None, str, str, int, int, bool]


def _env_count(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(
            f"{name}={raw!r} is not a whole number; unset it or give e.g. 200"
        ) from None
    if value < 1:
        raise ValueError(f"{name} must be 1 or more, got {value}")
    return value


class _Session:
    """One event loop and one target for a whole Hypothesis run.

    Each example starts from an empty backend: the target's ``reset`` when it has one (cheap on
    a server), else a fresh target from the factory.
    """

    def __init__(self, factory: TargetFactory, request: pytest.FixtureRequest) -> None:
        self._factory = factory
        self._request = request
        self._runner = asyncio.Runner()
        self._stack: AsyncExitStack | None = None
        self._jobs: Conformance | None = None
        self._call: asyncio.Task[Any] | None = None
        """The task of the call ``run`` is waiting for."""

    def run(self, awaitable: Awaitable[T]) -> T:
        coroutine: Coroutine[Any, Any, T] = self._tracked(awaitable)
        try:
            return self._runner.run(coroutine)
        except BaseException:
            self._stop_cut_off_call()
            raise
        finally:
            self._call = None

    async def _tracked(self, awaitable: Awaitable[T]) -> T:
        self._call = asyncio.current_task()
        return await awaitable

    def _stop_cut_off_call(self) -> None:
        """Cancel a call that an exception from outside it cut off (pytest-timeout raises in
        the loop's wait). Left pending, it would go on during the next example's calls, against
        a backend reset under it, and report a mismatch that never happened."""
        call = self._call
        if call is not None and not call.done():
            call.cancel()
            with suppress(BaseException):
                self._runner.get_loop().run_until_complete(call)

    def fresh(self) -> Conformance:
        jobs = self._jobs
        if jobs is not None and jobs.target.reset is not None:
            self.run(jobs.target.reset())
            return jobs
        self._close_target()
        stack = AsyncExitStack()
        self._jobs = self.run(
            stack.enter_async_context(open_conformance(self._factory, self._request))
        )
        self._stack = stack
        return self._jobs

    def _close_target(self) -> None:
        if self._stack is not None:
            stack, self._stack, self._jobs = self._stack, None, None
            self.run(stack.aclose())

    def close(self) -> None:
        try:
            self._close_target()
        finally:
            self._runner.close()


def _comparable(row: JobRow) -> JobRow:
    """A row without the fields the model does not track (``updated_at``, ``progress``)."""
    return replace(row, updated_at=row.created_at, progress=None)


def _in_seq_order(steps: Sequence[StepRecord]) -> list[StepRecord]:
    """Steps in ``seq`` order, and by name where ``seq``s are equal: the protocol leaves the
    order of those open, so both sides are put in this one order before they are compared."""
    return sorted(steps, key=lambda step: (step.seq, step.name))


def _has_operator_surface(machine: _DriverMachine) -> bool:
    return machine.jobs.driver.introspect is not None


def _same(what: str, got: object, want: object) -> None:
    if got != want:
        raise AssertionError(
            f"{what}: the driver answered\n  {got!r}\nbut the reference model says\n  {want!r}"
        )


class _DriverMachine(RuleBasedStateMachine):
    session: _Session
    """Set on the subclass one run builds: Hypothesis makes machines from a class."""

    def __init__(self) -> None:
        super().__init__()
        self.jobs = self.session.fresh()
        self.model = ReferenceQueue()
        self.claims: list[ClaimedJob] = []
        self.tokens: set[tuple[str, str, str]] = set()
        """(job id, worker, claim) of every claim handed out: a row never gets one twice."""
        self.ids: list[str] = []

    # -- helpers -----------------------------------------------------------------------------

    def _run(self, awaitable: Awaitable[T]) -> T:
        return self.session.run(awaitable)

    @property
    def _now(self) -> datetime:
        return self.jobs.now()

    def _request(self, spec: RequestSpec, data: st.DataObject) -> EnqueueRequest:
        name, tenant, key, queue, delay, max_attempts, reuse_id = spec
        job_id = new_id()
        if reuse_id and self.ids:
            job_id = data.draw(st.sampled_from(self.ids), label="reused id")
        else:
            self.ids.append(job_id)
        return EnqueueRequest(
            id=job_id,
            run_id=new_id(),
            name=name,
            queue=queue,
            input={"n": len(self.ids)},
            idempotency_key=key,
            tenant_id=tenant,
            max_attempts=max_attempts,
            run_at=self._now + timedelta(seconds=delay),
        )

    def _pick_claim(self, data: st.DataObject) -> ClaimedJob:
        """A claim handed out earlier: one that still holds its row, one whose row another
        claim took over since (the write fencing exists for), or any."""
        holding, superseded = [], []
        for job in self.claims:
            row = self.model.rows[job.id]
            if row.held_by(job.claim):
                holding.append(job)
            elif row.state is JobState.RUNNING:
                superseded.append(job)
        choices = [st.sampled_from(pool) for pool in (holding, superseded) if pool]
        picked: ClaimedJob = data.draw(st.one_of(*choices, st.sampled_from(self.claims)), "claim")
        return picked

    # -- rules -------------------------------------------------------------------------------

    @initialize(specs=st.lists(_request_specs, min_size=1, max_size=4), data=st.data())
    def seed(self, specs: Sequence[RequestSpec], data: st.DataObject) -> None:
        """Start every sequence with rows, so no example is a run of empty claims."""
        for spec in specs:
            self.enqueue(spec, data)

    @rule(spec=_request_specs, data=st.data())
    def enqueue(self, spec: RequestSpec, data: st.DataObject) -> None:
        request = self._request(spec, data)
        got = self._run(self.jobs.driver.enqueue(request))
        _same(f"enqueue({request!r})", got, self.model.enqueue(request, self._now))

    @rule(specs=st.lists(_request_specs, min_size=1, max_size=3), data=st.data())
    def enqueue_many(self, specs: Sequence[RequestSpec], data: st.DataObject) -> None:
        requests = [self._request(spec, data) for spec in specs]
        got = self._run(self.jobs.driver.enqueue_many(requests))
        want = [self.model.enqueue(request, self._now) for request in requests]
        _same(f"enqueue_many({requests!r})", got, want)

    @rule(
        worker=st.sampled_from(_WORKERS),
        slots=st.fixed_dictionaries({q: st.integers(min_value=0, max_value=2) for q in _QUEUES}),
        visibility_timeout=st.sampled_from(_VISIBILITY),
        drop_exhausted=st.frozensets(st.sampled_from(_NAMES)),
    )
    def claim(
        self,
        worker: str,
        slots: dict[str, int],
        visibility_timeout: int,
        drop_exhausted: frozenset[str],
    ) -> None:
        self._claim(worker, slots, visibility_timeout, drop_exhausted)

    @rule(
        worker=st.sampled_from(_WORKERS),
        queue=st.sampled_from(_QUEUES),
        visibility_timeout=st.sampled_from(_VISIBILITY),
        drop_exhausted=st.sampled_from([frozenset(), frozenset(_NAMES)]),
    )
    def claim_one(
        self, worker: str, queue: str, visibility_timeout: int, drop_exhausted: frozenset[str]
    ) -> None:
        """A worker with one free slot, the commonest claim there is."""
        self._claim(worker, {queue: 1}, visibility_timeout, drop_exhausted)

    def _claim(
        self,
        worker: str,
        slots: dict[str, int],
        visibility_timeout: int,
        drop_exhausted: frozenset[str],
    ) -> None:
        now = self._now
        plan = self.model.plan_claim(slots, now)
        batch = self._run(
            self.jobs.driver.claim(
                worker_id=worker,
                slots=slots,
                visibility_timeout=visibility_timeout,
                drop_exhausted=drop_exhausted,
            )
        )
        what = f"claim(worker_id={worker!r}, slots={slots!r}, drop_exhausted={drop_exhausted!r})"
        got = {q: sorted(j.id for j in batch.jobs if j.queue == q) for q in plan.claimed}
        want = {q: sorted(ids) for q, ids in plan.claimed.items()}
        _same(f"{what} handed out", got, want)
        _same(f"{what} handed out (count)", len(batch.jobs), sum(len(v) for v in want.values()))
        buried = [e.id for e in batch.exhausted]
        if len(set(buried)) != len(buried):
            raise AssertionError(f"{what} reported a buried row twice: {buried!r}")
        if not plan.must_bury <= set(buried) <= plan.must_bury | plan.may_bury:
            raise AssertionError(
                f"{what} buried {sorted(buried)!r}; it must bury {sorted(plan.must_bury)!r} "
                f"and may also bury {sorted(plan.may_bury)!r}"
            )
        for job in batch.jobs:
            token = (job.id, job.claim.worker_id, job.claim.claim)
            if job.claim.worker_id != worker or token in self.tokens:
                raise AssertionError(f"{what} handed {job.id} out under a reused claim {token!r}")
            self.tokens.add(token)
        self.model.commit_claim(
            plan,
            {job.id: job.claim for job in batch.jobs},
            buried,
            lease_until=now + timedelta(seconds=visibility_timeout),
            drop_exhausted=drop_exhausted,
            now=now,
        )
        for job in batch.jobs:
            _same(
                f"{what}: job {job.id}",
                replace(job, steps=dict(job.steps)),
                self.model.claimed_job(job.id),
            )
        for exhausted in batch.exhausted:
            _same(
                f"{what}: buried {exhausted.id}", exhausted, self.model.exhausted_job(exhausted.id)
            )
        self.claims.extend(batch.jobs)

    @precondition(lambda self: bool(self.claims))
    @rule(data=st.data(), duration_ms=st.sampled_from([None, 7]))
    def ack(self, data: st.DataObject, duration_ms: int | None) -> None:
        job = self._pick_claim(data)
        options = AckOptions(job.claim.worker_id, job.claim.claim, duration_ms)
        got = self._run(self.jobs.driver.ack(job.id, options))
        _same(f"ack({job.id}, {options!r})", got, self.model.ack(job.id, options, self._now))

    @precondition(lambda self: bool(self.claims))
    @rule(
        data=st.data(),
        kind=st.sampled_from(_NACK_KINDS),
        count_attempt=st.booleans(),
        error=st.sampled_from([None, "boom"]),
        run_in=st.sampled_from([None, -2, 0, 3, 20]),
        duration_ms=st.sampled_from([None, 11]),
    )
    def nack(
        self,
        data: st.DataObject,
        kind: tuple[bool, bool, bool],
        count_attempt: bool,
        error: str | None,
        run_in: int | None,
        duration_ms: int | None,
    ) -> None:
        job = self._pick_claim(data)
        dead_letter, fail, park = kind
        options = NackOptions(
            job.claim.worker_id,
            job.claim.claim,
            error=error,
            run_at=None if run_in is None else self._now + timedelta(seconds=run_in),
            dead_letter=dead_letter,
            fail=fail,
            park=park,
            count_attempt=count_attempt,
            duration_ms=duration_ms,
        )
        got = self._run(self.jobs.driver.nack(job.id, options))
        _same(f"nack({job.id}, {options!r})", got, self.model.nack(job.id, options, self._now))

    @precondition(lambda self: bool(self.claims))
    @rule(data=st.data(), visibility_timeout=st.sampled_from(_VISIBILITY))
    def heartbeat(self, data: st.DataObject, visibility_timeout: int) -> None:
        job = self._pick_claim(data)
        got = self._run(self.jobs.driver.heartbeat(job.id, job.claim, visibility_timeout))
        want = self.model.heartbeat(job.id, job.claim, visibility_timeout, self._now)
        _same(f"heartbeat({job.id}, {job.claim!r}, {visibility_timeout})", got, want)

    @precondition(lambda self: bool(self.claims))
    @rule(
        data=st.data(),
        name=st.sampled_from(["a", "b", "c"]),
        seq=st.integers(min_value=0, max_value=3),
        output=st.none() | st.integers(min_value=-5, max_value=5) | st.just({"k": [1, None]}),
        completed=st.booleans(),
        kind=st.sampled_from([None, *STEP_KINDS]),
    )
    def save_step(
        self,
        data: st.DataObject,
        name: str,
        seq: int,
        output: object,
        completed: bool,
        kind: StepKind | None,
    ) -> None:
        job = self._pick_claim(data)
        step = StepRecord(name, seq, output, completed, kind)
        got = self._run(self.jobs.driver.save_step(job.id, job.claim, job.run_id, step))
        want = self.model.save_step(job.id, job.claim, job.run_id, step)
        _same(f"save_step({job.id}, {job.claim!r}, {step!r})", got, want)

    @rule(seconds=st.sampled_from(_ADVANCES))
    def advance_clock(self, seconds: int) -> None:
        self.jobs.advance(seconds)

    @precondition(lambda self: _has_operator_surface(self) and not self.model.paused_queues)
    @rule(queue=st.sampled_from(_QUEUES))
    def pause_queue(self, queue: str) -> None:
        """One queue paused at a time, so the other one keeps the claims going."""
        self._run(self.jobs.introspect.pause_queue(queue))
        self.model.paused_queues.add(queue)

    @precondition(lambda self: _has_operator_surface(self) and bool(self.model.paused_queues))
    @rule()
    def resume_queue(self) -> None:
        (queue,) = self.model.paused_queues
        self._run(self.jobs.introspect.resume_queue(queue))
        self.model.paused_queues.discard(queue)

    # -- the state, after every step ---------------------------------------------------------

    @invariant()
    def the_backend_matches_the_model(self) -> None:
        self._run(self._compare_state())

    async def _compare_state(self) -> None:
        """Every read in one call into the loop: the check runs after each of thousands of
        operations."""
        now = self._now
        stats = sorted(await self.jobs.driver.stats(), key=lambda entry: entry.queue)
        _same("stats()", stats, self.model.stats(now))
        live = sorted(await self.jobs.driver.stats(include_done=False), key=lambda e: e.queue)
        _same("stats(include_done=False)", live, without_done(self.model.stats(now)))
        introspect = self.jobs.driver.introspect
        if introspect is None:
            return
        rows = [_comparable(row) for row in await self.jobs.all_rows()]
        _same("the rows", rows, [_comparable(row) for row in self.model.public_rows()])
        await self._compare_steps(introspect)
        totals = await introspect.counter_totals(since=now - _LONG_AGO)
        _same("counter_totals()", totals, self.model.counter_totals())
        paused = await introspect.paused_queues()
        _same("paused_queues()", sorted(paused), sorted(self.model.paused_queues))

    async def _compare_steps(self, introspect: JobIntrospection) -> None:
        """Every row's stored steps, as ``get`` lists them, are the model's for its run."""
        for job_id, row in self.model.rows.items():
            detail = await introspect.get(job_id)
            if detail is None:
                raise AssertionError(f"get({job_id}) answered None for a row list() shows")
            got = list(detail.steps)
            if got != sorted(got, key=lambda step: step.seq):
                raise AssertionError(f"get({job_id}).steps are not in seq order: {got!r}")
            want = self.model.steps.get(row.request.run_id, {}).values()
            _same(f"get({job_id}).steps", _in_seq_order(got), _in_seq_order(list(want)))


def check_against_reference(
    factory: TargetFactory,
    request: pytest.FixtureRequest,
    *,
    max_examples: int | None = None,
    step_count: int | None = None,
    shrink: bool = True,
    derandomize: bool = False,
) -> None:
    """Run the stateful test against ``factory``'s target; raises on the first difference.

    Counts default to ``UJOBS_CONFORMANCE_EXAMPLES`` / ``UJOBS_CONFORMANCE_STEPS``, else 25 x 30.
    ``derandomize`` draws the same operations on every run (for a test that must catch a known
    bug every time, not most times).
    """
    session = _Session(factory, request)
    budget = settings(
        max_examples=max_examples or _env_count(EXAMPLES_ENV, DEFAULT_EXAMPLES),
        stateful_step_count=step_count or _env_count(STEPS_ENV, DEFAULT_STEPS),
        deadline=None,
        report_multiple_bugs=False,
        derandomize=derandomize,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.filter_too_much,
            HealthCheck.data_too_large,
        ],
        phases=[phase for phase in Phase if shrink or phase is not Phase.shrink],
    )
    try:
        machine = type("DriverMachine", (_DriverMachine,), {"session": session})
        run_state_machine_as_test(machine, settings=budget)
    finally:
        session.close()


class StatefulRules:
    """The stateful test as a member of the conformance class (its factory is the class's)."""

    _target_factory: TargetFactory

    def test_random_operations_agree_with_the_reference_model(
        self, request: pytest.FixtureRequest
    ) -> None:
        check_against_reference(type(self)._target_factory, request)
