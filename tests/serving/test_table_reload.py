"""The endpoint's table against a change notified while a read of the same service is under way:
the read began before the change was committed, so keeping its answer would leave a stale pool
until the timer's refresh (the race behind a flaky endpoint test under load)."""

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

from serving.proxy.table import Table
from serving.routes import Replica, Service


def service(*ready: str) -> Service:
    replicas = tuple(Replica(job_id=i, host=h, port=8000) for i, h in enumerate(ready))
    return Service(run_id=7, project="main", name="moving", auth=False, strip_prefix=True, port=8000,
                   scales_to_zero=False, replicas=replicas, total_replicas=2)


def test_a_notification_during_a_read_reads_again_and_keeps_the_newer_answer():
    committed = {"now": service("b")}
    first_read_began, let_it_finish = threading.Event(), threading.Event()
    reads = []

    def read(project, name):
        answer = committed["now"]  # what the database holds when the read begins
        reads.append(answer)
        if len(reads) == 2:  # the read the first notification started: held until the change is in
            first_read_began.set()
            assert let_it_finish.wait(10)
        return answer

    async def scenario():
        table = Table(read, lambda run_id: None, ThreadPoolExecutor(2))
        entry = await table.get("main", "moving")
        assert [r.host for r in entry.service.replicas] == ["b"]
        table.changed(7)  # b leaves: its read begins and sees "b ready" ...
        await asyncio.get_running_loop().run_in_executor(None, first_read_began.wait, 10)
        committed["now"] = service()  # ... b's change commits, notified while that read is under way
        table.changed(7)
        let_it_finish.set()
        for _ in range(100):
            await asyncio.sleep(0.02)
            if not table._loading and table.entries[("main", "moving")].service.replicas == ():
                break
        return table.entries[("main", "moving")], len(reads)

    entry, count = asyncio.run(scenario())
    assert entry.service.replicas == (), "the read that began before the change must not be the one kept"
    assert count == 3


def test_reads_without_a_notification_between_are_still_shared():
    calls = []
    gate = threading.Event()

    def read(project, name):
        calls.append(1)
        gate.wait(10)
        return service("a")

    async def scenario():
        table = Table(read, lambda run_id: None, ThreadPoolExecutor(4))
        loop = asyncio.get_running_loop()
        waiting = [loop.create_task(table.get("main", "moving")) for _ in range(5)]
        await asyncio.sleep(0.1)
        gate.set()
        return await asyncio.gather(*waiting)

    entries = asyncio.run(scenario())
    assert len({id(e) for e in entries}) == 1
    assert len(calls) == 1
