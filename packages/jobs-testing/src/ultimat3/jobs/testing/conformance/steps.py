"""Steps: stored per run under the claim, handed back with every later claim of that run."""

from __future__ import annotations

from ultimat3.jobs.core import ClaimRef, StepRecord
from ultimat3.jobs.core.model import STEP_KINDS, JsonValue

from .target import Conformance, exactly

__all__ = ["StepRules"]


class StepRules:
    async def test_a_saved_step_comes_back_on_the_next_claim(self, jobs: Conformance) -> None:
        held = await jobs.running()
        step = StepRecord("provision", 0, {"org": "o-1"})
        assert await jobs.driver.save_step(held.id, held.claim, held.run_id, step)
        assert await jobs.nack(held, error="boom")
        assert (await jobs.claim_one(held.queue)).steps == {"provision": step}

    async def test_a_saved_steps_kind_comes_back_on_the_next_claim(self, jobs: Conformance) -> None:
        """The kind is what lets a replay refuse a record another kind of step wrote; a step
        stored before steps carried one comes back without it."""
        held = await jobs.running()
        steps: dict[str, StepRecord] = {
            kind: StepRecord(kind, seq, {"kind": kind}, completed=kind != "wait", kind=kind)
            for seq, kind in enumerate(STEP_KINDS)
        }
        steps["kindless"] = StepRecord("kindless", len(steps), "stored before kinds")
        for step in steps.values():
            assert await jobs.driver.save_step(held.id, held.claim, held.run_id, step)
        assert await jobs.nack(held)
        assert dict((await jobs.claim_one(held.queue)).steps) == steps
        assert list((await jobs.detail(held.id)).steps) == list(steps.values())

    async def test_steps_come_back_after_a_lapsed_lease(self, jobs: Conformance) -> None:
        held = await jobs.running()
        step = StepRecord("a", 0, [1, 2])
        assert await jobs.driver.save_step(held.id, held.claim, held.run_id, step)
        again = await jobs.lapse_and_reclaim(held)
        assert again.steps == {"a": step}

    async def test_steps_come_back_after_a_suspension(self, jobs: Conformance) -> None:
        held = await jobs.running()
        step = StepRecord("sleep:3d", 0, {"until": "2026-03-05T09:00:00+00:00"})
        assert await jobs.driver.save_step(held.id, held.claim, held.run_id, step)
        assert await jobs.nack(held, park=True, run_at=jobs.at(60), count_attempt=False)
        jobs.advance(60)
        assert (await jobs.claim_one(held.queue)).steps == {"sleep:3d": step}

    async def test_save_step_replaces_a_step_of_the_same_name(self, jobs: Conformance) -> None:
        held = await jobs.running()
        # A wait opened before steps carried their kind is answered by code that stores one.
        waiting = StepRecord("wait", 0, {"since": "t0"}, completed=False)
        answered = StepRecord("wait", 0, {"payload": {"ok": True}}, kind="wait")
        assert await jobs.driver.save_step(held.id, held.claim, held.run_id, waiting)
        assert await jobs.driver.save_step(held.id, held.claim, held.run_id, answered)
        assert await jobs.nack(held)
        assert (await jobs.claim_one(held.queue)).steps == {"wait": answered}

    async def test_an_open_wait_round_trips_as_not_completed(self, jobs: Conformance) -> None:
        held = await jobs.running()
        waiting = StepRecord("wait", 3, {"event": "paid", "deadline": None}, completed=False)
        assert await jobs.driver.save_step(held.id, held.claim, held.run_id, waiting)
        assert await jobs.nack(held)
        assert (await jobs.claim_one(held.queue)).steps["wait"] == waiting

    async def test_step_outputs_round_trip_as_json(self, jobs: Conformance) -> None:
        held = await jobs.running()
        outputs: list[JsonValue] = [
            None,
            0,
            -7,
            2.5,
            True,
            "",
            "ünïcødé ✓",
            [],
            {},
            {"a": [1, {"b": None}]},
            1.0,
            1e16,
            -0.0,
            [True, 1, 1.5],
            "nul \x00 inside",
            {"z": 1, "a": 2},
        ]
        steps = {
            f"s{seq}": StepRecord(f"s{seq}", seq, output) for seq, output in enumerate(outputs)
        }
        for step in steps.values():
            assert await jobs.driver.save_step(held.id, held.claim, held.run_id, step)
        assert await jobs.nack(held)
        replayed = dict((await jobs.claim_one(held.queue)).steps)
        assert replayed == steps
        # == holds True == 1 and 1.0 == 1: a replay must give back the very types it stored.
        assert {name: exactly(s.output) for name, s in replayed.items()} == {
            name: exactly(s.output) for name, s in steps.items()
        }

    async def test_steps_belong_to_their_run(self, jobs: Conformance) -> None:
        held = await jobs.running(queue="q")
        step = StepRecord("a", 0, 1)
        assert await jobs.driver.save_step(held.id, held.claim, held.run_id, step)
        await jobs.enqueue(queue="q")
        assert (await jobs.claim_one("q")).steps == {}

    async def test_save_step_under_a_stale_claim_stores_nothing(self, jobs: Conformance) -> None:
        stale = await jobs.running()
        fresh = await jobs.lapse_and_reclaim(stale)
        before = await jobs.snapshot(stale.id)
        late = StepRecord("late", 0, "from the lapsed attempt")
        assert not await jobs.driver.save_step(stale.id, stale.claim, stale.run_id, late)
        assert await jobs.snapshot(stale.id) == before
        assert await jobs.nack(fresh)
        assert (await jobs.claim_one(fresh.queue)).steps == {}

    async def test_save_step_after_the_settle_stores_nothing(self, jobs: Conformance) -> None:
        held = await jobs.running()
        assert await jobs.nack(held, park=True, run_at=jobs.at(5), count_attempt=False)
        step = StepRecord("late", 0, 1)
        assert not await jobs.driver.save_step(held.id, held.claim, held.run_id, step)
        jobs.advance(5)
        assert (await jobs.claim_one(held.queue)).steps == {}

    async def test_save_step_of_an_unknown_job_answers_false(self, jobs: Conformance) -> None:
        ref = ClaimRef("w1", "no-such-claim")
        unknown = "0190a000-0000-7000-8000-0000000000ff"
        assert not await jobs.driver.save_step(unknown, ref, "no-run", StepRecord("a", 0, 1))

    async def test_the_operator_reads_steps_in_start_order(self, jobs: Conformance) -> None:
        held = await jobs.running()
        for seq, name in [(2, "charge"), (0, "provision"), (1, "email")]:
            step = StepRecord(name, seq, {"seq": seq})
            assert await jobs.driver.save_step(held.id, held.claim, held.run_id, step)
        detail = await jobs.detail(held.id)
        assert [step.name for step in detail.steps] == ["provision", "email", "charge"]

    async def test_a_replayed_step_is_the_one_saved_whatever_its_readers_did(
        self, jobs: Conformance
    ) -> None:
        held = await jobs.running()
        step = StepRecord("a", 0, {"v": [1]})
        assert await jobs.driver.save_step(held.id, held.claim, held.run_id, step)
        step.output["v"].append("changed by the body")
        (read,) = (await jobs.detail(held.id)).steps
        read.output["v"].append("changed by a reader")
        again = await jobs.lapse_and_reclaim(held)
        assert again.steps["a"].output == {"v": [1]}
