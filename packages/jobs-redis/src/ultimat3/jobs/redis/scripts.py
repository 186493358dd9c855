"""The Lua scripts: one per operation, loaded once per server and called by SHA.

Each script is ``lua/<name>.lua`` behind the parts of ``lua/prelude.lua`` it uses — the files an
operator reads (``Script.source`` is the exact text loaded, runnable with ``redis-cli --eval``).
Only the parts a script names are prepended, transitively: Lua builds every function of a chunk
each time the script runs, and the whole prelude cost ~9 us a call (measured, Redis 7.0) where an
enqueue's own work is about as much. A server that lost its script cache (a restart, ``SCRIPT
FLUSH``) answers NOSCRIPT; the call then loads every script again and retries once (a script
refused with NOSCRIPT never ran).

A call whose connection broke after its command was written is repeated only when the script is
in ``REPEATABLE``: a second run there answers what the first would have. Any other call may have
run, so its caller gets the ``ConnectionError`` — repeated blindly it would lie: an enqueue would
answer ``deduped`` for its own insert, a nack False for one that landed, and a claim would leave
the first run's rows running with no worker (a final attempt then buried, never run). The
driver's claim and settle catch it and look for what the first run did (``driver.py``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import ConnectionError, NoScriptError
from ultimat3.jobs.core.logs import log_event

from .wire import DEFAULT_COMMAND_TIMEOUT, Wire

__all__ = ["REPEATABLE", "SCRIPT_NAMES", "Script", "ScriptRunner", "script"]

SCRIPT_NAMES = (
    "enqueue",
    "claim",
    "claimed",
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
    "bulk_count",
    "resume_queue",
    "record_worker",
    "workers",
    "task_fire",
    "counters_due",
    "counters_swap",
    "lease",
    "backfill",
    "events",
    "scheduler",
)

REPEATABLE = frozenset(
    {
        # reading only
        "stats",
        "page",
        "get",
        "bulk_count",
        "claimed",
        # writing what a second run writes again, answering the same
        "heartbeat",  # the same lease_until, still owned
        "save_step",  # the same step value, still owned
        "progress",
        "workers",  # drops expired registry rows, then reads
        "record_worker",
        "lease",  # a holder that got its slot keeps it; release and renew are idempotent
        "task_fire",
        "counters_due",  # a rebuilt index is rebuilt the same
        "backfill",  # begin adopts the row the first run opened
    }
)
"""Scripts a broken connection may call again without changing what their caller is told."""


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    source: str
    sha: str


def _read(name: str) -> str:
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")


_DEFINITION = re.compile(r"^local (?:function (\w+)|([\w, ]+?) =)")


@dataclass(frozen=True, slots=True)
class _Part:
    names: tuple[str, ...]
    text: str


def _parts(prelude: str) -> tuple[str, list[_Part]]:
    """The prelude's opening comment, and its top-level definitions each with the comment above
    it."""
    head, _, rest = prelude.partition("\n\n")
    parts: list[_Part] = []
    pending: list[str] = []
    for line in rest.splitlines():
        found = _DEFINITION.match(line)
        if found:
            names = found.group(1) or found.group(2)
            parts.append(_Part(tuple(n.strip() for n in names.split(",")), ""))
            pending.append(line)
            parts[-1] = _Part(parts[-1].names, "\n".join(pending))
            pending = []
        elif line.startswith("--") or not parts:
            pending.append(line)
        else:
            parts[-1] = _Part(parts[-1].names, "\n".join([parts[-1].text, *pending, line]))
            pending = []
    return head, parts


_COMMENT = re.compile(r"--.*$", re.MULTILINE)


def _uses(text: str, names: tuple[str, ...]) -> bool:
    """Whether ``text``'s code (its comments aside) names any of ``names``."""
    code = _COMMENT.sub("", text)
    return any(re.search(rf"\b{re.escape(name)}\b", code) for name in names)


def _build(name: str, head: str, parts: list[_Part]) -> Script:
    body = _read(name)
    wanted: set[int] = set()
    frontier = [body]
    while frontier:
        text = frontier.pop()
        for index, part in enumerate(parts):
            if index not in wanted and _uses(text, part.names):
                wanted.add(index)
                frontier.append(part.text)
    used = "\n".join(part.text for index, part in enumerate(parts) if index in wanted)
    source = f"{head}\n\n{used}\n\n-- {name}.lua\n{body}"
    return Script(name, source, hashlib.sha1(source.encode()).hexdigest())


_HEAD, _PARTS = _parts(_read("prelude"))
_SCRIPTS = {name: _build(name, _HEAD, _PARTS) for name in SCRIPT_NAMES}


def script(name: str) -> Script:
    return _SCRIPTS[name]


class ScriptRunner:
    """Calls scripts by SHA, loading them all the first time and after a NOSCRIPT.

    On a plain ``redis.asyncio.Redis`` the calls travel on the driver's pipelined connection
    (``wire.py``, with ``command_timeout`` as its deadline); on any other client (a
    ``RedisCluster`` routes each call by its first key, all of one slot) through the client
    itself, under its own timeouts. A cluster client is kept from repeating a script outside
    ``REPEATABLE``; any other client's own retry policy applies as configured.
    """

    def __init__(
        self, client: Redis | RedisCluster, *, command_timeout: float = DEFAULT_COMMAND_TIMEOUT
    ) -> None:
        self._client = client
        self._wire = Wire(client, timeout=command_timeout) if type(client) is Redis else None
        self._loaded = False
        self._loading: asyncio.Task[None] | None = None
        """The latest load, which every call that finds the scripts missing meanwhile waits for:
        a burst of first calls, or of calls a restarted server answered NOSCRIPT, loads the
        scripts once, not once per call (9,000 concurrent first calls took 12 s)."""
        self._loads = 0
        """How many loads have started: a call refused NOSCRIPT joins only a load that started
        after it sent its command, whose SCRIPT LOADs the server ran after that refusal."""

    async def load(self, *, started_after: int = -1) -> None:
        """Load every script, or wait for the load in flight when it started after the
        ``started_after``-th."""
        loading = self._loading
        if loading is None or loading.done() or self._loads <= started_after:
            self._loads += 1
            loading = self._loading = asyncio.get_running_loop().create_task(self._load_all())
            # Its failure reaches every caller waiting; one all of them gave up on is read here.
            loading.add_done_callback(lambda task: task.cancelled() or task.exception())
        await asyncio.shield(loading)

    async def _load_all(self) -> None:
        scripts = _SCRIPTS.values()
        if isinstance(self._client, RedisCluster):
            # A cluster client refuses SCRIPT LOAD in a pipeline; called alone, it loads the
            # script on every primary, so whichever node owns the namespace's slot has it.
            await asyncio.gather(*(self._client.script_load(s.source) for s in scripts))
        elif self._wire is None:
            pipe = self._client.pipeline(transaction=False)
            for loaded in scripts:
                pipe.script_load(loaded.source)
            await pipe.execute()
        else:
            loads = (["SCRIPT", "LOAD", loaded.source] for loaded in scripts)
            await asyncio.gather(*(self._on_wire("load", c, repeatable=True) for c in loads))
        self._loaded = True

    async def __call__(
        self,
        name: str,
        keys: Sequence[str],
        args: Sequence[Any],
    ) -> Any:
        loaded = _SCRIPTS[name]
        again = name in REPEATABLE
        if not self._loaded:
            await self.load()
        sent_after = self._loads
        try:
            return await self._evalsha(loaded, keys, args, again)
        except NoScriptError:
            log_event(logging.INFO, "jobs.redis.scripts-reloaded", script=name)
            await self.load(started_after=sent_after)
            return await self._evalsha(loaded, keys, args, again)

    async def _evalsha(
        self, loaded: Script, keys: Sequence[str], args: Sequence[Any], repeatable: bool
    ) -> Any:
        if self._wire is None:
            evalsha = ("EVALSHA", loaded.sha, len(keys), *keys, *args)
            if isinstance(self._client, RedisCluster) and not repeatable:
                # A cluster client sends a command again when its connection broke, unless it
                # was told the node: then it still follows MOVED/ASK, and lets the error through.
                node = self._client.get_node_from_key(keys[0])
                if node is not None:
                    return await self._client.execute_command(*evalsha, target_nodes=node)
            return await self._client.execute_command(*evalsha)
        command = ["EVALSHA", loaded.sha, str(len(keys)), *keys, *args]
        return await self._on_wire(loaded.name, command, repeatable=repeatable)

    async def _on_wire(self, name: str, command: list[str], *, repeatable: bool) -> Any:
        """``command`` on the wire; once more on a fresh connection when the first broke and a
        repeat is harmless."""
        assert self._wire is not None
        try:
            return await self._wire.call(command)
        except ConnectionError as error:
            if not repeatable:
                raise
            log_event(logging.INFO, "jobs.redis.reconnected", script=name, error=str(error))
            return await self._wire.call(command)

    async def close(self) -> None:
        if self._wire is not None:
            await self._wire.close()
