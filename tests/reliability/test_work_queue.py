"""The gateway to the tokenize pool and the embeddings worker: queued work counts against
--max-queue, a deadline or a departed client drops it, and a running job's result is
ignored. Pure: a thread pool and an event loop, no model."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

import pytest

from warmslot.server.errors import ClientClosed, RequestTimeout, Unavailable
from warmslot.server.work_queue import WorkQueue


class FakeRequest:
    """An ASGI request whose client disconnects when `gone` is set."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()

    async def receive(self):
        await self.gone.wait()
        return {"type": "http.disconnect"}


def blocked_pool():
    pool = concurrent.futures.ThreadPoolExecutor(1)
    release = threading.Event()
    return pool, release


def test_a_full_queue_answers_503_with_retry_after_and_a_freed_place_is_reused():
    async def main():
        pool, release = blocked_pool()
        queue = WorkQueue("pool", lambda: 2)
        ran = []
        blocker = asyncio.ensure_future(queue.run(lambda job: pool.submit(job.call, release.wait)))
        await asyncio.sleep(0.1)  # started: it no longer waits
        waiting = [asyncio.ensure_future(queue.run(lambda job, i=i: pool.submit(job.call, ran.append, i))) for i in range(2)]
        await asyncio.sleep(0.05)
        assert queue.waiting == 2
        with pytest.raises(Unavailable) as err:
            await queue.run(lambda job: pool.submit(job.call, ran.append, 9))
        assert err.value.status == 503 and err.value.code == "queue_full" and err.value.headers["Retry-After"] == "1"
        release.set()
        await asyncio.gather(blocker, *waiting)
        assert queue.waiting == 0 and sorted(ran) == [0, 1]
        pool.shutdown()

    asyncio.run(main())


def test_work_past_its_deadline_is_dropped_before_it_starts():
    async def main():
        pool, release = blocked_pool()
        queue = WorkQueue("pool", lambda: 8)
        ran = []
        blocker = asyncio.ensure_future(queue.run(lambda job: pool.submit(job.call, release.wait)))
        await asyncio.sleep(0.1)
        started = time.monotonic()
        with pytest.raises(RequestTimeout):
            await queue.run(lambda job: pool.submit(job.call, ran.append, 1), deadline=time.monotonic() + 0.3)
        assert time.monotonic() - started < 5
        assert queue.waiting == 0
        release.set()
        await blocker
        await asyncio.sleep(0.1)
        assert ran == []  # never ran
        pool.shutdown()

    asyncio.run(main())


def test_a_client_that_leaves_drops_its_waiting_work_and_a_running_job_is_told_to_stop():
    async def main():
        pool = concurrent.futures.ThreadPoolExecutor(1)
        queue = WorkQueue("pool", lambda: 8)
        stopped = threading.Event()

        def long_job(job):
            if not job.start():
                return None
            while not job.cancelled():
                time.sleep(0.01)
            stopped.set()
            return "ignored"

        request = FakeRequest()
        running = asyncio.ensure_future(queue.run(lambda job: pool.submit(long_job, job), request=request))
        await asyncio.sleep(0.1)
        request.gone.set()
        with pytest.raises(ClientClosed) as err:
            await running
        assert err.value.status == 499
        assert await asyncio.to_thread(stopped.wait, 5)
        assert queue.waiting == 0
        pool.shutdown()

    asyncio.run(main())
