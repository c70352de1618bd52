"""The keyed work queue (``workqueue``): de-duplication, one worker per key, delays, error backoff."""

from __future__ import annotations

import asyncio

import pytest

from trainop.controller import workqueue


async def drain(queue: workqueue.WorkQueue[str]) -> list[str]:
    got = []
    while len(queue):
        key = await queue.get()
        got.append(key)
        queue.done(key)
    return got


async def test_a_key_added_many_times_is_queued_once_in_first_added_order() -> None:
    queue: workqueue.WorkQueue[str] = workqueue.WorkQueue()
    for key in ["a", "b", "a", "c", "b", "a"]:
        queue.add(key)
    assert await drain(queue) == ["a", "b", "c"]


async def test_a_key_added_while_processing_is_queued_again_after_done_not_handed_to_a_second_worker() -> (
    None
):
    queue: workqueue.WorkQueue[str] = workqueue.WorkQueue()
    queue.add("a")
    key = await queue.get()
    queue.add("a")
    queue.add("a")
    assert len(queue) == 0  # not ready while "a" is being processed
    queue.done(key)
    assert await drain(queue) == ["a"]


async def test_get_waits_for_a_key() -> None:
    queue: workqueue.WorkQueue[str] = workqueue.WorkQueue()
    getter = asyncio.create_task(queue.get())
    await asyncio.sleep(0.01)
    assert not getter.done()
    queue.add("x")
    assert await asyncio.wait_for(getter, 1) == "x"


async def test_add_after_queues_the_key_once_the_delay_passed() -> None:
    queue: workqueue.WorkQueue[str] = workqueue.WorkQueue()
    queue.add_after("a", 0.05)
    assert len(queue) == 0
    await asyncio.sleep(0.1)
    assert await drain(queue) == ["a"]


async def test_the_earliest_schedule_of_a_key_wins() -> None:
    queue: workqueue.WorkQueue[str] = workqueue.WorkQueue()
    queue.add_after("a", 10)
    queue.add_after("a", 0.02)
    queue.add_after("a", 5)
    await asyncio.sleep(0.06)
    assert await drain(queue) == ["a"]


async def test_a_zero_delay_is_an_immediate_add() -> None:
    queue: workqueue.WorkQueue[str] = workqueue.WorkQueue()
    queue.add_after("a", 0)
    assert await drain(queue) == ["a"]


async def test_drop_cancels_a_scheduled_key() -> None:
    queue: workqueue.WorkQueue[str] = workqueue.WorkQueue()
    queue.add_after("a", 0.02)
    queue.drop("a")
    await asyncio.sleep(0.05)
    assert len(queue) == 0


async def test_retry_delays_double_per_failure_up_to_the_cap_and_reset_after_forget() -> None:
    queue: workqueue.WorkQueue[str] = workqueue.WorkQueue(base_delay=0.5, max_delay=4)
    assert [queue.retry_delay("a") for _ in range(6)] == [0.5, 1, 2, 4, 4, 4]
    assert queue.retry_delay("b") == 0.5  # per key
    queue.forget("a")
    assert queue.retry_delay("a") == 0.5


async def test_shut_down_wakes_waiting_workers_with_shutdown() -> None:
    queue: workqueue.WorkQueue[str] = workqueue.WorkQueue()
    getter = asyncio.create_task(queue.get())
    await asyncio.sleep(0.01)
    queue.shut_down()
    with pytest.raises(workqueue.ShutDown):
        await asyncio.wait_for(getter, 1)
    queue.add("late")
    assert len(queue) == 0


async def test_new_keys_are_served_first_and_hold_the_others_back_while_they_are_processed() -> None:
    queue: workqueue.WorkQueue[str] = workqueue.WorkQueue(hold=10)
    queue.add("old")
    queue.add("new-1", new=True)
    queue.add("new-2", new=True)
    first = await queue.get()
    second = await queue.get()
    assert [first, second] == ["new-1", "new-2"]
    getter = asyncio.create_task(queue.get())
    await asyncio.sleep(0.02)
    assert not getter.done()  # held back: a new key is being processed
    queue.done(first)
    await asyncio.sleep(0.02)
    assert not getter.done()  # still one
    queue.done(second)
    assert await asyncio.wait_for(getter, 1) == "old"


async def test_the_others_are_held_back_at_most_hold_seconds_in_a_row() -> None:
    queue: workqueue.WorkQueue[str] = workqueue.WorkQueue(hold=0.05)
    queue.add("new", new=True)
    new = await queue.get()
    queue.add("a")
    queue.add("b")
    assert await asyncio.wait_for(queue.get(), 1) == "a"  # after the hold, though "new" is still processed
    assert await asyncio.wait_for(queue.get(), 0.01) == "b"  # and the others with it, no second hold
    queue.done(new)


async def test_without_a_hold_the_others_are_not_held_back() -> None:
    queue: workqueue.WorkQueue[str] = workqueue.WorkQueue()
    queue.add("new", new=True)
    new = await queue.get()
    queue.add("a")
    assert await asyncio.wait_for(queue.get(), 0.01) == "a"
    queue.done(new)


async def test_a_new_key_queued_again_by_done_or_add_after_is_not_new() -> None:
    queue: workqueue.WorkQueue[str] = workqueue.WorkQueue(hold=10)
    queue.add("n", new=True)
    n = await queue.get()
    queue.add("n", new=True)  # its own status write's echo, while it is processed: dirty
    queue.done(n)
    assert await queue.get() == "n"  # re-queued, not new: holds nothing back
    queue.add("a")
    assert await asyncio.wait_for(queue.get(), 0.01) == "a"


async def test_a_key_ready_for_max_wait_seconds_is_served_before_new_ones() -> None:
    queue: workqueue.WorkQueue[str] = workqueue.WorkQueue(hold=10, max_wait=0.05)
    queue.add("old")
    queue.add("new-1", new=True)
    queue.add("new-2", new=True)
    assert await queue.get() == "new-1"
    await asyncio.sleep(0.06)
    assert await asyncio.wait_for(queue.get(), 0.01) == "old"  # overdue: before new-2, despite the hold
    assert await queue.get() == "new-2"
