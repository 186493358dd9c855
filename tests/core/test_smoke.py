from ultimat3.jobs.core import FrozenClock, memory_job_driver


async def test_memory_driver_starts_empty() -> None:
    driver = memory_job_driver(clock=FrozenClock())
    assert await driver.stats() == []
