"""How a request's events reach the event loop: a stream gets every step's events as they
come; a whole reply (not streamed) gets its start, then everything else with its end."""

from __future__ import annotations

import asyncio
import threading

from warmslot.server.pipeline.submission import TaggedSink
from warmslot.slots import FinishReason
from warmslot.slots.requests import Event, Progress


async def _deliveries(quiet: bool, steps: list[list[Event]]) -> list[list[Event]]:
    """Push the steps from another thread, as the engine does; what the queue received."""
    loop, queue = asyncio.get_running_loop(), asyncio.Queue()
    sink = TaggedSink(loop, queue, 3, quiet=quiet)
    pusher = threading.Thread(target=lambda: [sink.push(step) for step in steps])
    pusher.start()
    await asyncio.to_thread(pusher.join)
    out = []
    while True:
        try:
            index, events = await asyncio.wait_for(queue.get(), 0.2)
        except asyncio.TimeoutError:  # TimeoutError itself from Python 3.11
            return out
        assert index == 3
        out.append(events)


STEPS = [
    [Event(started=True)],
    [Event(text="a", tokens=[1])],
    [Event(text="b", tokens=[2])],
    [Event(text="c", tokens=[3], finish=FinishReason.STOP)],
]


def test_a_stream_gets_every_step_as_it_comes():
    got = asyncio.run(_deliveries(False, STEPS))
    assert got == STEPS


def test_a_whole_reply_gets_its_start_then_the_rest_with_its_end():
    got = asyncio.run(_deliveries(True, STEPS))
    assert [len(events) for events in got] == [1, 3]
    assert got[0][0].started and "".join(ev.text for ev in got[1]) == "abc"
    assert got[1][-1].finish is FinishReason.STOP


def test_a_whole_reply_gets_progress_at_once_and_nothing_is_lost_before_it():
    progress = Progress(processed=5, elapsed_s=0.01)
    steps = [[Event(text="x", tokens=[9])], [Event(progress=progress)], [Event(text="y", tokens=[8])]]
    got = asyncio.run(_deliveries(True, steps))
    assert got == [[steps[0][0], steps[1][0]]]  # the token held until the progress, y still held
