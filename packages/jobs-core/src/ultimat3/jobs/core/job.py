"""``job()``: declare a unit of durable work, and the handle that queues it.

Every field is checked where it is declared, so a job no worker could honour fails at import, not
on its fourth attempt. ``idempotency_key`` and ``tenant`` are required — by the type for mypy, and
at runtime (``X_IDEMPOTENCY_REQUIRED``, ``X_JOB_TENANT_REQUIRED``) for generated code.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeAlias, TypeVar, cast, overload

from . import registry
from .clock import Clock, utc
from .codec import InputCodec
from .constants import (
    DEFAULT_EVENT_POLL_S,
    DEFAULT_QUEUE,
    MAX_CONCURRENCY_KEY_LENGTH,
    MAX_IDEMPOTENCY_KEY_BYTES,
    MAX_NAME_BYTES,
)
from .context import JobContext, ProgressFn, Settled
from .durations import Duration, parse_duration
from .errors import (
    IdempotencyRequiredError,
    InvariantError,
    JobConcurrencyInvalidError,
    JobConcurrencyKeyInvalidError,
    JobDeclarationInvalidError,
    JobDuplicateError,
    JobNameTakenError,
    JobsError,
    JobTenantMismatchError,
    JobTenantRequiredError,
)
from .facade import enqueuer_clock, jobs_facade
from .ids import new_id
from .jsonvalue import storable_name, storable_text
from .model import Enqueued, EnqueueRequest
from .retry import Retry
from .tenancy import Actor
from .threads import in_thread

if TYPE_CHECKING:
    from .steps import Step

__all__ = [
    "AnyJobHandle",
    "Concurrency",
    "JobDescriptor",
    "JobHandle",
    "OnConflict",
    "job",
    "job_lease_key",
]

InputT = TypeVar("InputT")
ResultT = TypeVar("ResultT")

OnConflict: TypeAlias = Literal["dedupe", "error"]

BODY_PARAMETERS = (
    "input",
    "step",
    "ctx",
    "progress",
    "attempt",
    "final_attempt",
    "job_id",
    "run_id",
)
"""What a body may ask for, by keyword; a body taking ``**kwargs`` is handed all of them."""


@dataclass(frozen=True, slots=True)
class Concurrency(Generic[InputT]):
    """At most ``limit`` runs in flight per ``key(input)``, fleet-wide.

    ``when_busy='wait'`` leaves a run ready (no attempt burned) until a slot frees;
    ``'fail'`` settles it failed with ``X_JOB_KEY_BUSY`` without running the body.
    """

    key: Callable[[InputT], str]
    limit: int = 1
    when_busy: Literal["wait", "fail"] = "wait"


def job_lease_key(name: str, key: str | None = None) -> str:
    """The lease a run counts under: ``job:<name>`` for a plain cap, ``job-key:<name>:<key>``
    per key (the name percent-encoded so no name can collide with another job's key)."""
    if key is None:
        return f"job:{name}"
    return f"job-key:{_encode(name)}:{key}"


def _encode(name: str) -> str:
    return name.replace("%", "%25").replace(":", "%3A")


@dataclass(frozen=True, slots=True)
class JobDescriptor:
    """The manifest row of a job: everything an operator surface shows about its declaration."""

    name: str
    queue: str
    input: str | None
    tenant: Literal["none", "input"]
    retry: Retry
    concurrency: Mapping[str, Any] | None
    timeout_s: float | None
    step_timeout_s: float | None
    event_poll_s: float
    on_settled: bool
    kind: Literal["job"] = "job"


@dataclass(frozen=True, slots=True)
class _Cap:
    """A declared concurrency, normalised: ``key`` None is the plain cap over the whole job."""

    limit: int
    key: Callable[[Any], str] | None = None
    when_busy: Literal["wait", "fail"] = "wait"


class JobHandle(registry.Declared, Generic[InputT, ResultT]):
    """The surface of one declared job: ``enqueue``, ``as_``, ``describe`` and ``run``."""

    kind = "job"

    def __init__(
        self,
        body: Callable[..., Any],
        *,
        input: type[InputT] | None,
        idempotency_key: Callable[[InputT], str],
        tenant: Callable[[InputT], str | None] | Literal["none"],
        retry: Retry | Mapping[str, Any] | None = None,
        concurrency: int | Concurrency[InputT] | Mapping[str, Any] | None = None,
        timeout: Duration | None = None,
        step_timeout: Duration | None = None,
        event_poll: Duration | None = None,
        queue: str = DEFAULT_QUEUE,
        name: str | None = None,
        on_settled: Callable[[Settled[Any]], Awaitable[None] | None] | None = None,
    ) -> None:
        self.body = _check_body(body)
        self._body_is_async = awaits_when_called(body)
        self.codec: InputCodec[InputT] = InputCodec(input)
        self.idempotency_key = _check_idempotency_key(idempotency_key)
        self.tenant = _check_tenant(tenant)
        self.retry = _check_retry(retry)
        self.concurrency = _check_concurrency(concurrency)
        self.timeout_s = _positive(timeout, "timeout")
        self.step_timeout_s = _positive(step_timeout, "step_timeout")
        self.event_poll_s = _positive(event_poll, "event_poll") or DEFAULT_EVENT_POLL_S
        self.queue = _check_name(queue, "queue")
        if on_settled is not None and not callable(on_settled):
            raise JobDeclarationInvalidError(
                "on_settled must be callable", meta={"field": "on_settled"}
            )
        self.on_settled = on_settled
        self.parameters = _body_parameters(self.body)
        """The names the body asks for, in ``BODY_PARAMETERS`` order."""
        if not self._body_is_async and "step" in inspect.signature(body).parameters:
            raise JobDeclarationInvalidError(
                f"{_named(body)}: a sync body cannot take step — its methods are coroutines, "
                "and a call the body cannot await would run nothing; declare it `async def`",
                meta={"field": "run", "parameter": "step"},
            )
        self._declare(body, name)
        self.__doc__ = body.__doc__
        self.__wrapped__ = body

    def __repr__(self) -> str:
        return f"<job {self.name!r} queue={self.queue!r}>"

    # -- what the declaration derives from an input ------------------------------------------

    def tenant_of(self, value: InputT) -> str | None:
        if self.tenant == "none":
            return None
        org: object = self.tenant(value)
        if org is None:
            return None
        tenant = str(org)
        if not storable_name(tenant):
            raise JobDeclarationInvalidError(
                f"{self.name}: tenant(input) answered {tenant!r:.80}, which is over "
                f"{MAX_NAME_BYTES} bytes or holds a NUL character or a lone surrogate (no "
                "driver can key a row by it)",
                meta={"job": self.name},
            )
        return tenant

    def idempotency_key_of(self, value: InputT) -> str:
        key = self.idempotency_key(value)
        if not isinstance(key, str) or not key or not storable_name(key, MAX_IDEMPOTENCY_KEY_BYTES):
            raise JobDeclarationInvalidError(
                f"{self.name}: idempotency_key(input) must answer a non-empty string of at most "
                f"{MAX_IDEMPOTENCY_KEY_BYTES} bytes with no NUL character and no lone surrogate "
                f"(every driver keys the row by it), got {key!r:.80}",
                meta={"job": self.name},
            )
        return key

    def concurrency_lease(self, value: InputT) -> tuple[str, int, Literal["wait", "fail"]] | None:
        """(lease key, limit, when_busy) for a run over ``value``; the key is validated here, at
        enqueue and again at every claim."""
        cap = self.concurrency
        if cap is None:
            return None
        if cap.key is None:
            return job_lease_key(self.name), cap.limit, cap.when_busy
        key = cap.key(value)
        if (
            not isinstance(key, str)
            or not key
            or len(key) > MAX_CONCURRENCY_KEY_LENGTH
            or not storable_text(key)
        ):
            raise JobConcurrencyKeyInvalidError(
                f"{self.name}: concurrency.key(input) must answer a non-empty string of at most "
                f"{MAX_CONCURRENCY_KEY_LENGTH} characters (an id, never a payload) with no NUL "
                f"character and no lone surrogate, got {key!r:.80}",
                meta={"job": self.name},
            )
        return job_lease_key(self.name, key), cap.limit, cap.when_busy

    def request(
        self,
        input: InputT,
        *,
        run_id: str | None = None,
        queue: str | None = None,
        delay: Duration | None = None,
        run_at: datetime | None = None,
        tenant_id: str | None = None,
        actor: Actor | None = None,
        key_prefix: str | None = None,
        clock: Clock | None = None,
    ) -> EnqueueRequest:
        """The row an enqueue of ``input`` inserts. Everything is decided here, by the
        enqueuer: the ids, the tenant, and ``run_at`` on the enqueuer's clock."""
        self._check_routes_here()
        parsed = self.codec.parse(input)
        payload = self.codec.dump(parsed)
        key = self.idempotency_key_of(parsed)
        self.concurrency_lease(parsed)
        declared = self.tenant_of(parsed)
        if self.tenant != "none" and not declared:
            raise JobTenantRequiredError(
                f"{self.name}: tenant(input) answered {declared!r}, no org to run for; a job "
                "declared with a tenant function needs one on every input, and work that "
                "belongs to no tenant declares tenant='none'",
                meta={"job": self.name},
            )
        if actor is not None:
            _check_actor(actor)
            if self.tenant != "none" and actor.org_id != declared:
                raise JobTenantMismatchError(
                    f"{self.name}: the actor acts for org {actor.org_id!r} but the input names "
                    f"{declared!r}; enqueue as an actor of that org",
                    meta={"job": self.name},
                )
            tenant_id = actor.org_id
        elif tenant_id is None:
            tenant_id = declared
        elif self.tenant != "none" and tenant_id != declared:
            raise JobTenantMismatchError(
                f"{self.name}: tenant_id={tenant_id!r} but the input names {declared!r}; the "
                "row runs for the org its input names",
                meta={"job": self.name},
            )
        else:
            _check_name(tenant_id, "tenant_id", InvariantError)
        if delay is not None and run_at is not None:
            raise InvariantError("pass delay or run_at, not both")
        now = (clock or enqueuer_clock()).now()
        if run_at is not None:
            due = _run_at(run_at)
        elif delay is not None:
            due = now + timedelta(seconds=parse_duration(delay, field="delay"))
        else:
            due = now
        return EnqueueRequest(
            id=new_id(),
            run_id=_check_name(run_id, "run_id") if run_id is not None else new_id(),
            name=self.name,
            queue=_check_name(queue, "queue") if queue is not None else self.queue,
            input=payload,
            idempotency_key=f"{key_prefix}{key}" if key_prefix else key,
            tenant_id=tenant_id,
            max_attempts=self.retry.attempts,
            run_at=due,
            enqueued_by=actor.id if actor is not None else None,
        )

    # -- the surface --------------------------------------------------------------------------

    async def enqueue(
        self,
        input: InputT,
        *,
        run_id: str | None = None,
        queue: str | None = None,
        delay: Duration | None = None,
        run_at: datetime | None = None,
        on_conflict: OnConflict = "dedupe",
    ) -> Enqueued:
        """Queue one run; joins the ambient transaction when an outbox facade is installed.

        A live row holding the same idempotency key (per tenant) means nothing is inserted:
        ``deduped=True`` with that row's ids — or ``X_JOB_DUPLICATE`` with
        ``on_conflict='error'``.
        """
        request = self.request(input, run_id=run_id, queue=queue, delay=delay, run_at=run_at)
        return await self._publish(request, on_conflict)

    async def as_(
        self,
        actor: Actor,
        input: InputT,
        *,
        run_id: str | None = None,
        queue: str | None = None,
        delay: Duration | None = None,
        run_at: datetime | None = None,
        on_conflict: OnConflict = "dedupe",
    ) -> Enqueued:
        """Queue on behalf of ``actor``: the row's tenant is the actor's org and
        ``enqueued_by`` its id (attribution, never authority). It never runs the body inline."""
        request = self.request(
            input, run_id=run_id, queue=queue, delay=delay, run_at=run_at, actor=actor
        )
        return await self._publish(request, on_conflict)

    def _check_routes_here(self) -> None:
        """A row of this job's name must run this job's body: refused when the name routes to
        another declaration (two modules each declaring ``send``, nobody calling define_api),
        whichever path builds the row — an enqueue, a task's fire, a batch of ``request()``."""
        routed = registry.job_named(self.name)
        if routed is not None and registry.same_declaration(routed, self):
            return
        where = "no declaration" if routed is None else f"another declaration ({routed.origin})"
        raise JobNameTakenError(
            f"job name {self.name!r} routes to {where}: a row queued under it would not run "
            "this body. Give this job its own name=, or register its module with define_api() "
            "so it is named after its export",
            meta={"name": self.name},
        )

    async def _publish(self, request: EnqueueRequest, on_conflict: OnConflict) -> Enqueued:
        if on_conflict not in ("dedupe", "error"):
            raise InvariantError(f"on_conflict must be 'dedupe' or 'error', got {on_conflict!r}")
        queued = await jobs_facade().enqueue(request)
        if queued.deduped and on_conflict == "error":
            raise JobDuplicateError(
                f"{self.name}: a live job already holds idempotency key "
                f"{request.idempotency_key!r} (job {queued.id})",
                meta={"job": self.name, "existing_id": queued.id},
            )
        return queued

    def describe(self) -> JobDescriptor:
        cap = self.concurrency
        concurrency: dict[str, Any] | None = None
        if cap is not None:
            concurrency = {"limit": cap.limit}
            if cap.key is not None:
                concurrency.update(keyed=True, when_busy=cap.when_busy)
        return JobDescriptor(
            name=self.name,
            queue=self.queue,
            input=self.codec.type_name,
            tenant="none" if self.tenant == "none" else "input",
            retry=self.retry,
            concurrency=concurrency,
            timeout_s=self.timeout_s,
            step_timeout_s=self.step_timeout_s,
            event_poll_s=self.event_poll_s,
            on_settled=self.on_settled is not None,
        )

    async def run(
        self,
        *,
        input: InputT,
        step: Step,
        ctx: JobContext[Any],
        attempt: int,
        final_attempt: bool,
        job_id: str,
        run_id: str,
        progress: ProgressFn | None = None,
    ) -> ResultT:
        """Call the body directly, as a test that drives it by hand does. ``final_attempt`` is
        required: the caller states it (``is_final_attempt(handle.retry, attempt)`` is the
        worker's own answer)."""
        offered = {
            "input": input,
            "step": step,
            "ctx": ctx,
            "attempt": attempt,
            "final_attempt": final_attempt,
            "job_id": job_id,
            "run_id": run_id,
            "progress": progress if progress is not None else _no_progress,
        }
        return await self.call_body({name: offered[name] for name in self.parameters})

    async def call_body(self, kwargs: Mapping[str, Any]) -> ResultT:
        """Call the body with ``kwargs``: exactly the parameters it declares, by name."""
        if self._body_is_async:
            returned: ResultT = await self.body(**kwargs)
            return returned
        result = await in_thread(self.body, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        return cast(ResultT, result)


AnyJobHandle: TypeAlias = JobHandle[Any, Any]


def _no_progress(done: float, total: float | None = None, note: str | None = None) -> None:
    return None


class _JobDecorator(Generic[InputT]):
    def __init__(self, options: dict[str, Any]) -> None:
        self._options = options

    @overload
    def __call__(
        self, body: Callable[..., Coroutine[Any, Any, ResultT]]
    ) -> JobHandle[InputT, ResultT]: ...

    @overload
    def __call__(self, body: Callable[..., ResultT]) -> JobHandle[InputT, ResultT]: ...

    def __call__(self, body: Callable[..., Any]) -> JobHandle[InputT, Any]:
        return JobHandle(body, **self._options)


_MISSING: Any = object()

if TYPE_CHECKING:

    def job(
        *,
        input: type[InputT] | None = None,
        idempotency_key: Callable[[InputT], str],
        tenant: Callable[[InputT], str | None] | Literal["none"],
        retry: Retry | None = None,
        concurrency: int | Concurrency[InputT] | None = None,
        timeout: Duration | None = None,
        step_timeout: Duration | None = None,
        event_poll: Duration | None = None,
        queue: str = DEFAULT_QUEUE,
        name: str | None = None,
        on_settled: Callable[[Settled[Any]], Awaitable[None] | None] | None = None,
    ) -> _JobDecorator[InputT]:
        """Declare a job over the decorated body. ``idempotency_key`` and ``tenant`` are
        required; see ``JobHandle`` for what the handle does."""
        ...

else:

    def job(*, idempotency_key=_MISSING, tenant=_MISSING, input=None, **options):
        if idempotency_key is _MISSING or idempotency_key is None:
            raise IdempotencyRequiredError(
                "job() needs idempotency_key: queues deliver at least once, so every job must be "
                "able to answer 'have I already run?' (e.g. idempotency_key=lambda i: f'x:{i.id}')"
            )
        if tenant is _MISSING or tenant is None:
            raise JobTenantRequiredError(
                "job() needs tenant: a function of the input naming the org the run acts for, "
                "or tenant='none' for work that belongs to no tenant"
            )
        return _JobDecorator(
            dict(options, input=input, idempotency_key=idempotency_key, tenant=tenant)
        )


# -- declaration checks ------------------------------------------------------------------------


def awaits_when_called(fn: object) -> bool:
    """Whether calling ``fn`` answers an awaitable: an ``async def`` function, or an object whose
    ``__call__`` is one."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - the method itself is what is asked
    )


def _named(fn: object) -> str:
    return str(getattr(fn, "__qualname__", None) or repr(fn))


def _check_body(body: Callable[..., Any]) -> Callable[..., Any]:
    if not callable(body):
        raise JobDeclarationInvalidError("job() decorates a function", meta={"field": "run"})
    return body


def _body_parameters(body: Callable[..., Any]) -> tuple[str, ...]:
    """The names the body asks for; all of them when it takes ``**kwargs``."""
    names: list[str] = []
    for parameter in inspect.signature(body).parameters.values():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            return BODY_PARAMETERS
        if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.POSITIONAL_ONLY):
            raise JobDeclarationInvalidError(
                f"{_named(body)}: job bodies take keyword parameters by name "
                f"({', '.join(BODY_PARAMETERS)})",
                meta={"field": "run"},
            )
        if parameter.name not in BODY_PARAMETERS:
            raise JobDeclarationInvalidError(
                f"{_named(body)}: unknown parameter {parameter.name!r}; a body may ask for "
                f"{', '.join(BODY_PARAMETERS)}",
                meta={"field": "run", "parameter": parameter.name},
            )
        names.append(parameter.name)
    return tuple(names)


def _check_idempotency_key(value: Any) -> Any:
    if not callable(value):
        raise JobDeclarationInvalidError(
            "idempotency_key must be a function of the input", meta={"field": "idempotency_key"}
        )
    return value


def _check_tenant(value: Any) -> Any:
    if value != "none" and not callable(value):
        raise JobDeclarationInvalidError(
            "tenant must be a function of the input, or 'none'", meta={"field": "tenant"}
        )
    return value


def _check_retry(value: Retry | Mapping[str, Any] | None) -> Retry:
    if value is None:
        return Retry()
    if isinstance(value, Retry):
        return value
    if isinstance(value, Mapping):
        try:
            return Retry(**value)
        except TypeError as exc:
            raise JobDeclarationInvalidError(f"retry: {exc}", meta={"field": "retry"}) from exc
    raise JobDeclarationInvalidError("retry must be a Retry", meta={"field": "retry"})


def _whole_positive(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 1
        and float(value).is_integer()
    )


def _check_concurrency(value: Any) -> _Cap | None:
    if value is None:
        return None
    if isinstance(value, Mapping):
        try:
            value = Concurrency(**value)
        except TypeError as exc:  # a field missing or unknown: the Mapping is not a Concurrency
            raise JobConcurrencyInvalidError(
                f"concurrency: {exc}", meta={"field": "concurrency"}
            ) from exc
    if isinstance(value, Concurrency):
        if not callable(value.key):
            raise JobConcurrencyInvalidError(
                "concurrency.key must be a function of the input", meta={"field": "concurrency"}
            )
        if not _whole_positive(value.limit):
            raise JobConcurrencyInvalidError(
                f"concurrency.limit must be a whole number >= 1, got {value.limit!r}",
                meta={"field": "concurrency"},
            )
        if value.when_busy not in ("wait", "fail"):
            raise JobConcurrencyInvalidError(
                f"concurrency.when_busy must be 'wait' or 'fail', got {value.when_busy!r}",
                meta={"field": "concurrency"},
            )
        return _Cap(limit=int(value.limit), key=value.key, when_busy=value.when_busy)
    if not _whole_positive(value):
        raise JobConcurrencyInvalidError(
            f"concurrency must be a whole number >= 1 or a Concurrency, got {value!r}",
            meta={"field": "concurrency"},
        )
    return _Cap(limit=int(value))


def _positive(value: Duration | None, field_name: str) -> float | None:
    if value is None:
        return None
    try:
        seconds = parse_duration(value, field=field_name)
    except InvariantError as exc:
        raise JobDeclarationInvalidError(exc.message, meta={"field": field_name}) from exc
    if seconds <= 0:
        raise JobDeclarationInvalidError(
            f"{field_name} must be positive; omit it for no ceiling",
            meta={"field": field_name},
        )
    return seconds


def _check_name(
    value: Any, field_name: str, error: type[JobsError] = JobDeclarationInvalidError
) -> str:
    if not isinstance(value, str) or not value.strip() or not storable_name(value):
        raise error(
            f"{field_name} must be a non-empty string of at most {MAX_NAME_BYTES} bytes with no "
            f"NUL character and no lone surrogate, got {value!r:.80}",
            meta={"field": field_name},
        )
    return value


def _check_actor(actor: Actor) -> None:
    """An actor's ids go on the row (its org as the tenant, its id as ``enqueued_by``): each
    None or a name every driver stores."""
    for field_name in ("id", "org_id"):
        if getattr(actor, field_name) is not None:
            _check_name(getattr(actor, field_name), f"actor.{field_name}", InvariantError)


def _run_at(value: Any) -> datetime:
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise InvariantError(
            f"run_at must be a timezone-aware datetime, got {value!r:.80}",
            meta={"field": "run_at"},
        )
    return utc(value)
