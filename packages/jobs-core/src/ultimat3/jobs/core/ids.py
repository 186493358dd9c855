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
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | counter << 64 | 0b10 << 62 | rand
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
