"""The wake's own statements: the session's LISTEN and the probe that proves it hears."""

from __future__ import annotations

__all__ = ["SQL_LISTEN", "SQL_LISTEN_OUTBOX", "SQL_WAKE_PROBE"]

SQL_LISTEN = """
listen x_jobs_wake
"""

SQL_LISTEN_OUTBOX = """
-- A commit that staged an outbox row while none waited unclaimed notifies this channel: the
-- relay of this process passes at once instead of on its poll.
listen x_outbox_wake
"""

SQL_WAKE_PROBE = """
-- Parameters: payload (a probe token, never a queue name). Sent through the pool, NOT the
-- listening session: arriving on the session proves a notification committed elsewhere reaches it.
select pg_notify('x_jobs_wake', %(payload)s)
"""
