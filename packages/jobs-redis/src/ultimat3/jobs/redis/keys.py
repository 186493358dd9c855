"""The key space of one queue namespace, and the cluster slot a key lands in.

Every key of a namespace starts with ``{<prefix>}:``. Redis Cluster hashes only the text inside
the first ``{…}`` of a key, so all of them share ONE slot: a script may touch any of them
atomically, on a single server or a cluster alike. The scripts build their keys from the base
passed as ``KEYS[1]`` (see ``lua/prelude.lua`` for the full list, each with what it holds).

================================  =======  ====================================================
key (after the base)              type     holds
================================  =======  ====================================================
``job:<id>``                      hash     one row
``steps:<run id>``                hash     the run's steps: name -> "<seq> <completed> <json>"
``live``                          hash     live key -> id of the live row holding it
``created``                       zset     every row by created_at (the ``list()`` order)
``queues``                        set      queues holding at least one row
``runs``                          hash     run id -> rows naming it
``q:<queue>:s:<state>``           zset     the queue's rows in one state, by created_at
``q:<queue>:due``                 zset     ready, delayed and suspended rows, by run_at
``q:<queue>:lease``               zset     running rows, by lease_until
``q:<queue>:expiry``              zset     done rows, by finished_at (swept under a done TTL)
``q:<queue>:woken``               string   a wake for the queue no claim has read yet (1 s)
``buried:<claim token>``          list     the rows one claim buried (expires with its lease)
``paused``, ``pausedtasks``       set      paused queues, paused tasks
``ctr:<job>``, ``ctrnames``       hash     one job's counter buckets; names having any
``ctridx:<job>``                  zset     its buckets "<width>:<start>", by width*10^10+start
``ctrlen:<job>``                  string   how many of its fields ``ctridx`` accounts for
``workers``, ``workers:exp``      hash     live worker rows; zset of their expiry
``taskfires``                     hash     task -> "<occurrence ms> <fired_at>"
``watermarks``                    hash     the scheduler's task -> occurrence ms
``lease:<key>``, ``leaseorder``   hash     fleet slots: holder -> "<expires> <order>"
``leasexp:<key>``                 zset     the same holders by expiry
``backfill:<run id>``             hash     one ledger row; ``backfills`` (zset) orders them
``ev:<id>``                       hash     one event (expires on the server's clock)
``evby:<event>``, ``evexpiry``    zset     events by publish time; by expiry, for the purge
``wake``                          channel  the queue names announced to idle workers
================================  =======  ====================================================
"""

from __future__ import annotations

from ultimat3.jobs.core.errors import InvariantError

__all__ = ["DEFAULT_PREFIX", "hash_slot", "namespace_base"]

DEFAULT_PREFIX = "ujobs"
_RESERVED = frozenset("{}*?[]\\")
"""Braces would move the hash tag; glob characters would let ``clear()`` match other keys."""
CLUSTER_SLOTS = 16384


def namespace_base(prefix: str) -> str:
    """``{prefix}:`` — the start of every key of the namespace."""
    if not prefix or any(c in _RESERVED or c.isspace() for c in prefix):
        raise InvariantError(
            f"prefix={prefix!r} must be a non-empty name without spaces, braces or glob "
            "characters (*?[]\\); the driver wraps it in {} itself so every key of the "
            "namespace shares one cluster slot",
            meta={"prefix": prefix},
        )
    return "{" + prefix + "}:"


def _crc16(data: bytes) -> int:
    """CRC-16/XMODEM, the checksum Redis Cluster slots keys by."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def hash_slot(key: str | bytes) -> int:
    """The cluster slot of ``key``: the CRC16 of its first non-empty ``{tag}``, else of it all."""
    raw = key.encode() if isinstance(key, str) else key
    start = raw.find(b"{")
    if start != -1:
        end = raw.find(b"}", start + 1)
        if end > start + 1:
            raw = raw[start + 1 : end]
    return _crc16(raw) % CLUSTER_SLOTS
