"""Job and run ids: UUIDv7 strings, so the id order is the enqueue order.

Claim order breaks ties on ``run_at`` by id and ``list()`` pages newest first by
``(created_at, id)``; both rely on ids minted later sorting later, which a random UUIDv4 does not
give. Within one process, ids minted in the same millisecond still sort in minting order.
"""

from __future__ import annotations

import random
import threading
import time

__all__ = ["new_id"]

_lock = threading.Lock()
_last_ms = 0
_counter = 0


def new_id() -> str:
    global _last_ms, _counter
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last_ms:
            _counter += 1
            if _counter > 0xFFF:  # 12 bits spent in this millisecond: borrow the next one
                _last_ms += 1
                _counter = 0
            ms = _last_ms
        else:
            _last_ms = ms
            _counter = 0
        counter = _counter
    rand = random.getrandbits(62)  # the module reseeds itself in a forked child
    # 48 bits of ms, version 7, 12 bits of counter, variant 0b10, 62 random bits, in the five
    # groups of the text form.
    return "%08x-%04x-%04x-%04x-%012x" % (  # noqa: UP031 - one format call, no slicing
        ms >> 16 & 0xFFFFFFFF,
        ms & 0xFFFF,
        0x7000 | counter,
        0x8000 | rand >> 48,
        rand & 0xFFFFFFFFFFFF,
    )
