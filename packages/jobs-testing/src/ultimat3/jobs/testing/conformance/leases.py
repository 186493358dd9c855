"""The lease store: at most ``limit`` live holders per key, in slot order, expiring by TTL."""

from __future__ import annotations

from .target import Conformance

__all__ = ["LeaseRules"]


class LeaseRules:
    async def test_acquire_takes_a_free_slot(self, jobs: Conformance) -> None:
        assert await jobs.leases.acquire("k", "a", limit=1, ttl=30)
        assert await jobs.leases.holders("k") == ["a"]

    async def test_acquire_is_refused_once_limit_others_hold_the_key(
        self, jobs: Conformance
    ) -> None:
        leases = jobs.leases
        assert await leases.acquire("k", "a", limit=2, ttl=30)
        assert await leases.acquire("k", "b", limit=2, ttl=30)
        assert not await leases.acquire("k", "c", limit=2, ttl=30)
        assert await leases.holders("k") == ["a", "b"]

    async def test_holders_are_listed_in_slot_order(self, jobs: Conformance) -> None:
        leases = jobs.leases
        for holder in ["zeta", "alpha", "mu"]:
            jobs.advance(1)
            assert await leases.acquire("k", holder, limit=5, ttl=60)
        assert await leases.holders("k") == ["zeta", "alpha", "mu"]

    async def test_acquire_by_a_holder_renews_its_own_slot(self, jobs: Conformance) -> None:
        leases = jobs.leases
        assert await leases.acquire("k", "a", limit=1, ttl=30)
        jobs.advance(20)
        assert await leases.acquire("k", "a", limit=1, ttl=30)
        jobs.advance(20)
        assert await leases.holders("k") == ["a"]
        assert not await leases.acquire("k", "b", limit=1, ttl=30)

    async def test_a_renewing_acquire_keeps_the_slot_order(self, jobs: Conformance) -> None:
        leases = jobs.leases
        assert await leases.acquire("k", "a", limit=2, ttl=30)
        assert await leases.acquire("k", "b", limit=2, ttl=30)
        assert await leases.acquire("k", "a", limit=2, ttl=30)
        assert await leases.holders("k") == ["a", "b"]

    async def test_a_holder_expires_ttl_after_its_last_acquire(self, jobs: Conformance) -> None:
        leases = jobs.leases
        assert await leases.acquire("k", "a", limit=1, ttl=30)
        jobs.advance(29.999)
        assert await leases.holders("k") == ["a"]
        jobs.advance(0.001)
        assert await leases.holders("k") == []
        assert await leases.acquire("k", "b", limit=1, ttl=30)

    async def test_renew_extends_the_ttl_from_now(self, jobs: Conformance) -> None:
        leases = jobs.leases
        assert await leases.acquire("k", "a", limit=1, ttl=30)
        jobs.advance(20)
        assert await leases.renew("k", "a", ttl=30)
        jobs.advance(29)
        assert await leases.holders("k") == ["a"]
        jobs.advance(1)
        assert await leases.holders("k") == []

    async def test_renew_by_a_non_holder_answers_false(self, jobs: Conformance) -> None:
        leases = jobs.leases
        assert await leases.acquire("k", "a", limit=2, ttl=30)
        assert not await leases.renew("k", "b", ttl=30)
        assert await leases.holders("k") == ["a"]

    async def test_renew_after_expiry_answers_false(self, jobs: Conformance) -> None:
        leases = jobs.leases
        assert await leases.acquire("k", "a", limit=1, ttl=30)
        jobs.advance(30)
        assert not await leases.renew("k", "a", ttl=30)
        assert await leases.holders("k") == []

    async def test_release_frees_the_slot(self, jobs: Conformance) -> None:
        leases = jobs.leases
        assert await leases.acquire("k", "a", limit=1, ttl=30)
        await leases.release("k", "a")
        assert await leases.holders("k") == []
        assert await leases.acquire("k", "b", limit=1, ttl=30)

    async def test_a_released_holder_that_returns_takes_the_last_slot(
        self, jobs: Conformance
    ) -> None:
        leases = jobs.leases
        for holder in ["a", "b", "c"]:
            assert await leases.acquire("k", holder, limit=3, ttl=30)
        await leases.release("k", "a")
        assert await leases.acquire("k", "a", limit=3, ttl=30)
        assert await leases.holders("k") == ["b", "c", "a"]

    async def test_release_by_a_non_holder_changes_nothing(self, jobs: Conformance) -> None:
        leases = jobs.leases
        assert await leases.acquire("k", "a", limit=1, ttl=30)
        await leases.release("k", "b")
        await leases.release("other-key", "a")
        assert await leases.holders("k") == ["a"]

    async def test_keys_are_independent(self, jobs: Conformance) -> None:
        leases = jobs.leases
        assert await leases.acquire("job:a", "h1", limit=1, ttl=30)
        assert await leases.acquire("job:b", "h2", limit=1, ttl=30)
        assert await leases.holders("job:a") == ["h1"]
        assert await leases.holders("job:b") == ["h2"]

    async def test_an_unknown_key_has_no_holders(self, jobs: Conformance) -> None:
        assert await jobs.leases.holders("job-key:never:held") == []

    async def test_an_expired_holder_frees_its_slot_for_the_limit(self, jobs: Conformance) -> None:
        leases = jobs.leases
        assert await leases.acquire("k", "a", limit=2, ttl=10)
        assert await leases.acquire("k", "b", limit=2, ttl=60)
        jobs.advance(10)
        assert await leases.acquire("k", "c", limit=2, ttl=60)
        assert await leases.holders("k") == ["b", "c"]
