"""Durable names: export-name stamping and every X_JOB_DUPLICATE rule."""

from __future__ import annotations

import itertools
import types
from typing import Any

import pytest

from ultimat3.jobs.core import FrozenClock, JobNameTakenError, define_api, job, task
from ultimat3.jobs.core.job import JobHandle
from ultimat3.jobs.core.registry import job_named

_modules = itertools.count()


def module_name() -> str:
    return f"fake_app.jobs_{next(_modules)}"


def declare_in(
    module: str, *, name: str | None = None, fn_name: str = "work"
) -> JobHandle[Any, Any]:
    async def work() -> None:
        return None

    work.__module__ = module
    work.__name__ = work.__qualname__ = fn_name
    return job(input=None, idempotency_key=lambda _: "k", tenant="none", name=name)(work)


def module(name: str, **exports: Any) -> types.ModuleType:
    mod = types.ModuleType(name)
    for export, value in exports.items():
        setattr(mod, export, value)
    return mod


def test_define_api_stamps_the_export_name_and_routes_through_the_same_handle() -> None:
    name = module_name()
    handle = declare_in(name, fn_name="_impl")
    api = define_api(jobs=[module(name, onboard_org_v1=handle)])
    assert handle.name == "onboard_org_v1"
    assert api.jobs == {"onboard_org_v1": handle}
    assert job_named("onboard_org_v1") is handle


def test_an_explicit_name_is_kept_whatever_it_is_exported_as() -> None:
    name = module_name()
    handle = declare_in(name, name=f"{name}.mail.send")
    define_api(jobs=[module(name, send_mail=handle)])
    assert handle.name == f"{name}.mail.send"


def test_a_handle_without_a_usable_name_is_anonymous() -> None:
    handle = job(input=None, idempotency_key=lambda _: "k", tenant="none")(lambda: None)
    assert handle.name.startswith("anonymous-job-")


def test_registering_the_same_handle_twice_is_one_registration() -> None:
    name = module_name()
    handle = declare_in(name)
    mod = module(name, notify=handle)
    define_api(jobs=[mod])
    define_api(jobs=[mod, mod])
    assert handle.name == "notify"


def test_two_definitions_setting_the_same_name_are_refused_at_declaration() -> None:
    taken = f"{module_name()}.taken"
    declare_in(module_name(), name=taken)
    with pytest.raises(JobNameTakenError) as caught:
        declare_in(module_name(), name=taken)
    assert caught.value.code == "X_JOB_DUPLICATE"


def test_two_handles_under_one_export_name_are_refused_by_define_api() -> None:
    first, second = module_name(), module_name()
    a, b = declare_in(first), declare_in(second)
    with pytest.raises(JobNameTakenError):
        define_api(jobs=[module(first, clash=a), module(second, clash=b)])


def test_one_handle_exported_twice_is_refused_by_define_api() -> None:
    name = module_name()
    handle = declare_in(name)
    with pytest.raises(JobNameTakenError, match="exported twice"):
        define_api(jobs=[module(name, a=handle, b=handle)])


def test_an_imported_handle_is_not_an_export_of_the_importing_module() -> None:
    home, other = module_name(), module_name()
    handle = declare_in(home)
    export = f"sync_{home.rsplit('_', 1)[1]}"
    define_api(jobs=[module(home, **{export: handle}), module(other, sync_alias=handle)])
    assert handle.name == export


def test_an_export_name_held_by_another_explicit_declaration_is_refused() -> None:
    home = module_name()
    held = f"{home}.held"
    declare_in(module_name(), name=held)
    handle = declare_in(home)
    with pytest.raises(JobNameTakenError):
        define_api(jobs=[module(home, **{held: handle})])


def test_tasks_follow_the_same_rules() -> None:
    name = module_name()

    def tick() -> list[Any]:
        return []

    tick.__module__ = name
    handle = task(cron="0 3 * * *", tz="UTC", enqueue=tick)
    api = define_api(tasks=[module(name, nightly_digest=handle)])
    assert handle.name == "nightly_digest"
    assert api.tasks == {"nightly_digest": handle}
    with pytest.raises(JobNameTakenError):
        define_api(tasks=[module(name, a=handle, b=handle)])


def test_two_lambdas_of_one_module_setting_the_same_name_are_refused() -> None:
    """They share a module and a qualified name (``<lambda>``): only their lines tell them apart,
    so they are two declarations, not one module imported twice."""
    taken = f"{module_name()}.purge"
    task(cron="0 3 * * *", tz="UTC", name=taken, enqueue=lambda: ())
    with pytest.raises(JobNameTakenError) as caught:
        task(cron="0 0 * * *", tz="UTC", name=taken, enqueue=lambda: ())
    assert caught.value.code == "X_JOB_DUPLICATE"


def test_the_same_declaration_seen_again_keeps_its_name() -> None:
    """A module imported again (or reloaded) declares the same function, at the same line, its
    source compiled anew."""
    name = module_name()
    source = (
        "from ultimat3.jobs.core import task\n"
        f"nightly = task(cron='0 3 * * *', tz='UTC', name='{name}.again', enqueue=lambda: ())\n"
    )
    declared = []
    for _ in range(2):
        namespace: dict[str, Any] = {"__name__": name}
        exec(compile(source, f"<{name}>", "exec"), namespace)
        declared.append(namespace["nightly"])
    assert [handle.name for handle in declared] == [f"{name}.again"] * 2


async def test_a_job_whose_name_routes_to_another_declaration_refuses_to_enqueue(
    driver: Any,
) -> None:
    """Two modules each declare ``send`` and nobody called define_api: a row of the second would
    run the first's body, so the second's enqueue is refused instead."""
    first = declare_in(module_name(), fn_name="send_twice_declared")
    second = declare_in(module_name(), fn_name="send_twice_declared")
    assert (first.name, second.name) == ("send_twice_declared", "send_twice_declared")
    await first.enqueue(None)
    with pytest.raises(JobNameTakenError, match="routes to another declaration"):
        await second.enqueue(None)


def test_a_task_firing_a_job_whose_name_routes_elsewhere_is_refused() -> None:
    """The scheduler builds its rows with ``request()``: refused there too, or the fire would
    queue a row that runs the other declaration's body."""
    first = declare_in(module_name(), fn_name="send_fired_twice")
    second = declare_in(module_name(), fn_name="send_fired_twice")
    assert job_named("send_fired_twice") is first
    nightly = task(
        cron="0 3 * * *", tz="UTC", name=f"{module_name()}.fire", enqueue=lambda: [(second, None)]
    )
    with pytest.raises(JobNameTakenError, match="routes to another declaration"):
        nightly.requests(0, clock=FrozenClock())


async def test_a_handle_of_a_module_reloaded_since_still_enqueues(driver: Any) -> None:
    """The same declaration seen twice: the old handle's rows run the new one's body, which is
    the same code."""
    name = module_name()
    source = (
        "from ultimat3.jobs.core import job\n"
        "async def reloaded(*, input: None) -> None:\n"
        "    return None\n"
        "notify = job(input=None, idempotency_key=lambda _: 'k', tenant='none')(reloaded)\n"
    )
    handles = []
    for _ in range(2):
        namespace: dict[str, Any] = {"__name__": name}
        exec(compile(source, f"<{name}>", "exec"), namespace)
        handles.append(namespace["notify"])
    assert not (await handles[0].enqueue(None)).deduped


async def test_a_name_define_api_moves_a_job_off_goes_to_the_job_waiting_for_it(
    driver: Any,
) -> None:
    """Two modules each declare ``send``; define_api registers the first under its export name,
    and the second, which only waited for ``send``, now holds it and enqueues."""
    first_home = module_name()
    first = declare_in(first_home, fn_name="send_waiting")
    second = declare_in(module_name(), fn_name="send_waiting")
    define_api(jobs=[module(first_home, send_welcome_waiting=first)])
    assert (first.name, second.name) == ("send_welcome_waiting", "send_waiting")
    assert job_named("send_waiting") is second
    assert not (await second.enqueue(None)).deduped


async def test_a_set_name_takes_it_from_a_job_that_only_defaulted_to_it(driver: Any) -> None:
    """Whichever is imported first: a set name is durable, a default one is not. The job that
    defaulted to the name waits for define_api, and enqueues nothing meanwhile."""
    defaulted = declare_in(module_name(), fn_name="send_set_later")
    explicit = declare_in(module_name(), fn_name="send_sms_later", name="send_set_later")
    assert job_named("send_set_later") is explicit
    assert not (await explicit.enqueue(None)).deduped
    with pytest.raises(JobNameTakenError):
        await defaulted.enqueue(None)


def test_define_api_accepts_a_name_whose_holder_it_moves_in_the_same_call() -> None:
    first_home, second_home = module_name(), module_name()
    first = declare_in(first_home, fn_name="send_moved_in_call")
    second = declare_in(second_home, fn_name="send_moved_in_call")
    define_api(
        jobs=[
            module(first_home, send_email_moved=first),
            module(second_home, send_moved_in_call=second),
        ]
    )
    assert (first.name, second.name) == ("send_email_moved", "send_moved_in_call")
    assert job_named("send_moved_in_call") is second


def test_a_job_a_module_builds_from_an_imported_body_is_its_export() -> None:
    """``send_welcome = job(...)(send)`` with ``send`` from another module: the handle is this
    module's, though its body's ``__module__`` names the other one."""
    mailer, app = module_name(), module_name()
    handle = declare_in(mailer, fn_name="send_imported_body")
    api = define_api(jobs=[module(mailer), module(app, send_welcome_imported=handle)])
    assert api.jobs == {"send_welcome_imported": handle}
    assert handle.name == "send_welcome_imported"
