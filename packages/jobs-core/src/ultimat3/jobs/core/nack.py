"""Where a nack sends a row, and what it counts — decided once, here, for every driver."""

from __future__ import annotations

from .model import CounterKind, JobState, NackOptions

__all__ = ["nack_counter", "nack_state"]


def nack_state(options: NackOptions) -> JobState:
    """The state a nack moves a row to: dead, failed, suspended or ready, in that precedence."""
    if options.dead_letter:
        return JobState.DEAD
    if options.fail:
        return JobState.FAILED
    if options.park:
        return JobState.SUSPENDED
    return JobState.READY


def nack_counter(options: NackOptions) -> CounterKind | None:
    """The counter a nack moves in the same operation; None for an attempt handed back."""
    state = nack_state(options)
    if state is JobState.DEAD:
        return "dead"
    if state is JobState.FAILED:
        return "failed"
    if state is JobState.READY and options.count_attempt:
        return "retried"
    return None
