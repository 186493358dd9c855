"""Backoff schedules, jitter, and what the thrown error decides."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ultimat3.jobs.core import (
    JobsError,
    Retry,
    equal_jitter,
    failure_verdict,
    is_final_attempt,
    jitter_stated_delay,
    register_error_retry,
    retry_schedule,
)
from ultimat3.jobs.core.errors import (
    EventWaitTimeoutError,
    JobDeclarationInvalidError,
    JobTimeoutError,
    StepDuplicateError,
    StepOutputInvalidError,
)
from ultimat3.jobs.core.retry import retry_classification


class GatewayBusyError(JobsError):
    code = "X_TEST_GATEWAY_BUSY"


class InvoiceRejectedError(JobsError):
    code = "X_TEST_INVOICE_REJECTED"


class FlakyError(JobsError):
    code = "X_TEST_FLAKY"


register_error_retry(
    {
        "X_TEST_GATEWAY_BUSY": "retry-after",
        "X_TEST_INVOICE_REJECTED": "terminal",
        "X_TEST_FLAKY": "retryable",
    }
)


def test_the_exponential_schedule_doubles() -> None:
    assert retry_schedule(Retry(attempts=5, backoff="exponential", delay=1)) == [1, 2, 4, 8]


def test_the_linear_schedule_adds() -> None:
    assert retry_schedule(Retry(attempts=4, backoff="linear", delay="2s")) == [2, 4, 6]


def test_the_fixed_schedule_repeats() -> None:
    assert retry_schedule(Retry(attempts=3, backoff="fixed", delay="500ms")) == [0.5, 0.5]


def test_max_delay_caps_the_schedule() -> None:
    assert retry_schedule(Retry(attempts=6, delay=1, max_delay=5)) == [1, 2, 4, 5, 5]


@given(st.floats(min_value=0, max_value=1e6), st.integers(0, 2**32))
def test_equal_jitter_keeps_at_least_half_and_never_exceeds(delay: float, seed: int) -> None:
    jittered = equal_jitter(delay, random.Random(seed))
    assert delay / 2 <= jittered <= delay


@given(st.floats(min_value=0, max_value=1e6), st.integers(0, 2**32))
def test_a_stated_delay_is_never_shortened(delay: float, seed: int) -> None:
    spread = jitter_stated_delay(delay, random.Random(seed))
    assert delay <= spread <= delay * 1.1


@given(st.integers(1, 20), st.integers(1, 25))
def test_final_attempt_is_the_one_comparison(attempts: int, attempt: int) -> None:
    assert is_final_attempt(Retry(attempts=attempts), attempt) == (attempt >= attempts)


def test_an_unclassified_error_keeps_the_attempt_count_path() -> None:
    retry = Retry(attempts=3, delay=1, jitter=False)
    assert failure_verdict(retry, 1, ValueError("boom")).kind == "retried"
    assert failure_verdict(retry, 1, ValueError("boom")).delay_s == 1
    exhausted = failure_verdict(retry, 3, ValueError("boom"))
    assert (exhausted.kind, exhausted.stop_reason) == ("dead-lettered", "attempts-exhausted")


def test_a_terminal_code_dead_letters_on_the_attempt_it_happened() -> None:
    verdict = failure_verdict(Retry(attempts=5), 1, InvoiceRejectedError("no"))
    assert (verdict.kind, verdict.stop_reason) == ("dead-lettered", "terminal")


def test_a_step_output_json_cannot_hold_dead_letters_on_its_first_attempt() -> None:
    """The same output fails the same way on every attempt, after the step's side effect ran
    again each time: retrying only repeats the side effect."""
    verdict = failure_verdict(Retry(attempts=5), 1, StepOutputInvalidError("nan"))
    assert (verdict.kind, verdict.stop_reason) == ("dead-lettered", "terminal")


def test_a_step_name_reused_dead_letters_on_its_first_attempt() -> None:
    """A duplicate name, or one another kind of step stored, is the run's code: every retry
    meets it again."""
    verdict = failure_verdict(Retry(attempts=5), 1, StepDuplicateError("twice"))
    assert (verdict.kind, verdict.stop_reason) == ("dead-lettered", "terminal")


def test_an_error_no_retry_could_change_ends_the_run_whatever_its_codes_class() -> None:
    """X_JOB_TIMEOUT is retryable, but a required wait's timeout is stored and replayed."""
    timed_out = EventWaitTimeoutError("wait_for_event 'paid' timed out")
    assert retry_classification(timed_out) == "retryable"
    verdict = failure_verdict(Retry(attempts=5), 1, timed_out)
    assert (verdict.kind, verdict.stop_reason) == ("dead-lettered", "terminal")
    assert verdict.terminal_because == EventWaitTimeoutError.final_because
    assert failure_verdict(Retry(attempts=5), 1, JobTimeoutError("deadline")).kind == "retried"


def test_dead_letter_false_drops_instead() -> None:
    verdict = failure_verdict(Retry(attempts=1, dead_letter=False), 1, ValueError("x"))
    assert verdict.kind == "dropped"


def test_a_retry_after_code_waits_the_stated_time_clamped_and_spread() -> None:
    retry = Retry(attempts=5, delay=1, max_delay=30)
    stated = failure_verdict(retry, 1, GatewayBusyError("slow", meta={"retry_after_seconds": 20}))
    assert stated.kind == "retried"
    assert 20 <= stated.delay_s <= 22
    clamped = failure_verdict(retry, 1, GatewayBusyError("slow", meta={"retry_after_seconds": 600}))
    assert 30 <= clamped.delay_s <= 33


def test_a_stated_delay_without_jitter_is_exact() -> None:
    retry = Retry(attempts=5, jitter=False)
    verdict = failure_verdict(retry, 1, GatewayBusyError("slow", meta={"retry_after_seconds": 7}))
    assert verdict.delay_s == 7


@pytest.mark.parametrize(
    "stated", [0, -3, float("nan"), float("inf"), float("-inf"), "soon", None, True]
)
def test_an_unstated_retry_after_falls_back_to_the_backoff(stated: object) -> None:
    retry = Retry(attempts=5, delay=4, jitter=False)
    verdict = failure_verdict(
        retry, 1, GatewayBusyError("slow", meta={"retry_after_seconds": stated})
    )
    assert verdict.delay_s == 4


def test_a_retry_after_code_on_the_final_attempt_still_stops() -> None:
    verdict = failure_verdict(
        Retry(attempts=2), 2, GatewayBusyError("slow", meta={"retry_after_seconds": 5})
    )
    assert verdict.stop_reason == "attempts-exhausted"


def test_a_retryable_code_takes_the_backoff() -> None:
    verdict = failure_verdict(Retry(attempts=3, delay=2, jitter=False), 2, FlakyError("again"))
    assert (verdict.kind, verdict.delay_s) == ("retried", 4)


def test_a_classification_outside_the_three_is_refused() -> None:
    with pytest.raises(JobsError):
        register_error_retry({"X_TEST_ODD": "sometimes"})  # type: ignore[dict-item]


def test_a_long_exponential_schedule_without_max_delay_stays_within_a_year() -> None:
    from ultimat3.jobs.core.retry import MAX_RETRY_DELAY_S, backoff_delay

    retry = Retry(attempts=2000, delay=1, jitter=False)
    assert backoff_delay(retry, 40) == MAX_RETRY_DELAY_S
    assert backoff_delay(retry, 1999) == MAX_RETRY_DELAY_S
    assert failure_verdict(retry, 1500, ValueError("x")).delay_s == MAX_RETRY_DELAY_S


def test_a_huge_stated_retry_after_is_held_to_the_ceiling() -> None:
    """A responder's 1e12 s would name a time no datetime holds: the settle must still land."""
    from ultimat3.jobs.core.retry import MAX_RETRY_DELAY_S

    huge = GatewayBusyError("slow", meta={"retry_after_seconds": 1e12})
    exact = failure_verdict(Retry(attempts=5, jitter=False), 1, huge)
    assert (exact.kind, exact.delay_s) == ("retried", MAX_RETRY_DELAY_S)
    spread = failure_verdict(Retry(attempts=5), 1, huge)
    assert spread.delay_s == MAX_RETRY_DELAY_S


def test_a_max_delay_past_the_ceiling_does_not_lift_it() -> None:
    from ultimat3.jobs.core.retry import MAX_RETRY_DELAY_S, backoff_delay

    retry = Retry(attempts=50, delay="1000d", max_delay="10000d", jitter=False)
    assert backoff_delay(retry, 1) == MAX_RETRY_DELAY_S
    huge = GatewayBusyError("slow", meta={"retry_after_seconds": 1e12})
    assert failure_verdict(retry, 1, huge).delay_s == MAX_RETRY_DELAY_S


def test_a_stated_retry_after_past_a_floats_range_waits_the_ceiling() -> None:
    """A responder's 310-digit Retry-After: clamped like any other, not an overflow that would
    fail the settle and leave the row to lapse."""
    from ultimat3.jobs.core.retry import MAX_RETRY_DELAY_S

    retry = Retry(attempts=3, jitter=False)
    huge = GatewayBusyError("slow", meta={"retry_after_seconds": 10**400})
    assert failure_verdict(retry, 1, huge).delay_s == MAX_RETRY_DELAY_S


@pytest.mark.parametrize(
    "options",
    [
        {"delay": 10**400},
        {"max_delay": timedelta.max},
        {"delay": 1e12},
        {"jitter": "false"},
        {"dead_letter": None},
        {"dead_letter": 0},
        {"attempts": 2**31},
    ],
    ids=repr,
)
def test_a_retry_policy_no_driver_can_honour_is_refused_where_it_is_declared(
    options: dict[str, Any],
) -> None:
    with pytest.raises(JobDeclarationInvalidError):
        Retry(**options)
