"""The Lua scripts: one per operation, loaded once per server and called by SHA.

Each script is ``lua/prelude.lua`` followed by ``lua/<name>.lua`` — the files an operator reads
(and can run with ``redis-cli --eval`` after concatenating the two). A server that lost its
script cache (a restart, ``SCRIPT FLUSH``) answers NOSCRIPT; the call then loads every script
again and retries once.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import NoScriptError
from ultimat3.jobs.core.logs import log_event

__all__ = ["SCRIPT_NAMES", "Script", "ScriptRunner", "script"]

SCRIPT_NAMES = (
    "enqueue",
    "claim",
    "settle",
    "heartbeat",
    "save_step",
    "progress",
    "stats",
    "page",
    "get",
    "remove",
    "requeue",
    "cancel",
    "promote",
    "bulk",
    "resume_queue",
    "record_worker",
    "workers",
    "task_fire",
    "counters_swap",
    "lease",
    "backfill",
    "events",
    "scheduler",
)


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    source: str
    sha: str


def _read(name: str) -> str:
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")


def _build(name: str, prelude: str) -> Script:
    source = f"{prelude}\n-- {name}.lua\n{_read(name)}"
    return Script(name, source, hashlib.sha1(source.encode()).hexdigest())


_PRELUDE = _read("prelude")
_SCRIPTS = {name: _build(name, _PRELUDE) for name in SCRIPT_NAMES}


def script(name: str) -> Script:
    return _SCRIPTS[name]


class ScriptRunner:
    """Calls scripts by SHA on one client, loading them all the first time and after a NOSCRIPT."""

    def __init__(self, client: Redis) -> None:
        self._client = client
        self._loaded = False

    async def load(self) -> None:
        pipe = self._client.pipeline(transaction=False)
        for loaded in _SCRIPTS.values():
            pipe.script_load(loaded.source)
        await pipe.execute()
        self._loaded = True

    async def __call__(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        loaded = _SCRIPTS[name]
        if not self._loaded:
            await self.load()
        try:
            return await self._client.evalsha(loaded.sha, len(keys), *keys, *args)
        except NoScriptError:
            log_event(logging.INFO, "jobs.redis.scripts-reloaded", script=name)
            await self.load()
            return await self._client.evalsha(loaded.sha, len(keys), *keys, *args)
