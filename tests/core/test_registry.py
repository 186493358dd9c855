"""Durable names: export-name stamping and every X_JOB_DUPLICATE rule."""

from __future__ import annotations

import itertools
import types
from typing import Any

import pytest

from ultimat3.jobs.core import JobNameTakenError, define_api, job, task
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
    """A module imported again (or reloaded) declares the same function, at the same line."""
    taken = f"{module_name()}.again"
    for _ in range(2):
        task(cron="0 3 * * *", tz="UTC", name=taken, enqueue=lambda: ())


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
