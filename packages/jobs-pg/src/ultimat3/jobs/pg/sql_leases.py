"""Fleet-wide concurrency slots (``x_job_leases``): at most ``limit`` live holders per key.

A holder keeps its slot by renewing it before ``expires_at``; a holder that died stops renewing and
its slot frees itself when the TTL passes — no cleanup call needed.
"""

from __future__ import annotations

__all__ = [
    "SQL_LEASE_ACQUIRE",
    "SQL_LEASE_HOLDERS",
    "SQL_LEASE_LOCK",
    "SQL_LEASE_RELEASE",
    "SQL_LEASE_RENEW",
]

SQL_LEASE_LOCK = """
-- Parameters: key. Run first, in the transaction of an acquire or a renewal (READ COMMITTED):
-- acquirers and renewers of one key take turns, so the count SQL_LEASE_ACQUIRE reads (in its
-- own, later snapshot) cannot be raced past the limit, nor count as lapsed a slot whose renewal
-- is on its way.
select pg_advisory_xact_lock(hashtextextended(%(key)s, 0))
"""

SQL_LEASE_ACQUIRE = """
-- Parameters: key, holder, limit, now, expires_at (now + ttl). Run after SQL_LEASE_LOCK.
-- Takes a slot when fewer than limit live holders hold the key, or renews the slot this holder
-- already has (keeping its place in slot order). A holder whose own slot lapsed takes a new one at
-- the back. Expired holders of the key are swept. Answers whether the holder now holds a slot.
with live as (
    select holder
    from x_job_leases
    where key = %(key)s and expires_at > %(now)s
),
taken as (
    insert into x_job_leases as l (key, holder, acquired_at, expires_at)
    select %(key)s, %(holder)s, %(now)s, %(expires_at)s
    where exists (select 1 from live where holder = %(holder)s)
       or (select count(*) from live) < %(limit)s
    on conflict (key, holder) do update
    set expires_at = excluded.expires_at,
        acquired_at = case when l.expires_at > %(now)s
                           then l.acquired_at else excluded.acquired_at end,
        slot_order = case when l.expires_at > %(now)s
                          then l.slot_order else nextval('x_job_leases_slot_order_seq') end
    returning 1
),
swept as (
    delete from x_job_leases
    where key = %(key)s and expires_at <= %(now)s and holder <> %(holder)s
)
select exists (select 1 from taken)
"""

SQL_LEASE_RENEW = """
-- Parameters: key, holder, now, expires_at, synchronous_commit (as SQL_CLAIM takes it). Run
-- after SQL_LEASE_LOCK. Extends
-- a slot the holder still holds; a lapsed slot is not revived (another holder may have it by
-- now). Answers whether it landed. Committed without waiting for the WAL flush: a renewal lost in
-- a crash only shortens the slot.
update x_job_leases
set expires_at = %(expires_at)s
from (
    select set_config(
        'synchronous_commit',
        coalesce(%(synchronous_commit)s::text, current_setting('synchronous_commit')),
        true
    )
) as durability
where key = %(key)s and holder = %(holder)s and expires_at > %(now)s
returning 1
"""

SQL_LEASE_RELEASE = """
-- Parameters: key, holder.
delete from x_job_leases where key = %(key)s and holder = %(holder)s
"""

SQL_LEASE_HOLDERS = """
-- Parameters: key, now. The live holders, in the order they took their slots.
select holder
from x_job_leases
where key = %(key)s and expires_at > %(now)s
order by slot_order
"""
