"""Every Celery message the engine sends, named for what it asks; each one leaves after commit.

A message only says "see to row X now": the task claims the row and decides from what it finds,
so a message sent twice does nothing the second time and a lost one is sent again by the sweep.
Sending after commit (`transaction.on_commit`, at once outside a transaction) means no worker
looks for a row that is not committed yet, nor for a row the sender still holds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from django.db import transaction

from muster.celery import app


class _Tasks:
    """The engine's registered tasks by attribute (`registered.advance_job` is `engine.tasks.advance_job`):
    the same task objects, with their priority and options and whatever a test patched on them,
    found through Celery's registry so that this module, which every engine step imports, imports
    none of the task modules that import those steps back."""

    def __init__(self, module: str) -> None:
        self.module = module

    def __getattr__(self, name: str):
        full = f"{self.module}.{name}"
        if full not in app.tasks:
            app.loader.import_default_modules()  # engine.tasks (the app's `imports`), once per process
        return app.tasks[full]


registered = _Tasks("engine.tasks")

# Each message is its own lambda (registered.X.delay), so a callback captured in a test says which task it sends.


def provision_job(job_id: int) -> None:
    """A submitted job may look for its hosts (provision_job)."""
    transaction.on_commit(lambda: registered.provision_job.delay(job_id))


def recheck_jobs(job_ids: list[int]) -> None:
    """Jobs waiting for a host whose recheck is due may look again, together (recheck_jobs)."""
    if job_ids:
        ids = list(job_ids)
        transaction.on_commit(lambda: registered.recheck_jobs.delay(ids))


def watch_running() -> None:
    """The running jobs that are due may be looked at (the batch watch): beat's tick, sent again by
    the sweep when jobs are overdue because ticks were dropped in a backlog (it has no expiry)."""
    transaction.on_commit(lambda: registered.watch_running.delay())


def advance_job(job_id: int, countdown: float = 0) -> None:
    """A placed job's next start stage is due (advance_job): runner up, peers, start order."""
    if countdown:
        transaction.on_commit(lambda: registered.advance_job.apply_async((job_id,), countdown=countdown))
    else:
        transaction.on_commit(lambda: _gather("advance_job", job_id) or registered.advance_job.delay(job_id))


def finish_job(job_id: int, countdown: float = 0) -> None:
    """A terminating job may be stopped on its host and its host handed back (finish_job); inside
    `gathered`, with the other jobs the step ends (finish_jobs)."""
    if countdown:
        transaction.on_commit(lambda: registered.finish_job.apply_async((job_id,), countdown=countdown))
    else:
        transaction.on_commit(lambda: _gather("finish_job", job_id) or registered.finish_job.delay(job_id))


class _Gathered(threading.local):
    ids: dict[str, list[int]] | None = None


_gathered = _Gathered()  # per thread, as Django's connections are


@contextmanager
def gathered(sizes: Mapping[str, int]) -> Iterator[None]:
    """Around a batch step: the advance_job, finish_job and process_run messages its commits send
    at once (no countdown) are kept, and sent once the step is over as one message per
    `sizes[kind]` rows (advance_jobs, finish_jobs, process_runs), a lone one as itself (the sizes
    are engine/tuning.py's GATHERED, which this module, below the steps, does not import). A
    look that places a burst of runs, a watch batch that sees a burst of jobs end and the finish
    of that burst each send a few messages, not one per job: each message is a task, a claim and
    a read in the worker. Sent even when the step failed half-way (what it committed asks for
    them); nested, the outermost sends."""
    if _gathered.ids is not None:
        yield
        return
    _gathered.ids = {kind: [] for kind in _BATCHES}
    try:
        yield
    finally:
        ids, _gathered.ids = _gathered.ids, None
        transaction.on_commit(lambda: _send_gathered(ids, sizes))  # at once: a step's top is outside any transaction


def _gather(kind: str, pk: int) -> bool:
    """Keep a message for the open `gathered` block (True), or say there is none (False: send it)."""
    ids = _gathered.ids
    if ids is None:
        return False
    ids[kind].append(pk)
    return True


# a kind gathered (the name of its one-row task) -> the name of its batch task, both in `registered`
_BATCHES = {"advance_job": "advance_jobs", "finish_job": "finish_jobs", "process_run": "process_runs"}


def _send_gathered(ids: dict[str, list[int]], sizes: Mapping[str, int]) -> None:
    for kind, many in _BATCHES.items():
        pks = sorted(set(ids[kind]))  # a row asked for twice is one look; in the order the steps take them
        size = max(1, sizes.get(kind, 1))
        for start in range(0, len(pks), size):
            chunk = pks[start:start + size]
            if len(chunk) == 1:
                getattr(registered, kind).delay(chunk[0])
            else:
                getattr(registered, many).delay(chunk)


class _Commit:
    """The run nudges of one transaction's commit, in the order its callbacks run: a run's nudge
    goes once however many of its jobs moved in the transaction. Kept by the callbacks themselves,
    as they run (Django drops those of a rolled-back savepoint, so only the ones that commit count)."""

    def __init__(self) -> None:
        self.running = False
        self.sent: dict[int, str] = {}  # run -> the first nudge of it that went: "plain" or "if"

    def first(self, run_id: int, kind: str) -> bool:
        """Whether this nudge goes: a plain one unless a plain one went; a conditional one unless any went."""
        self.running = True
        went = self.sent.get(run_id)
        if went == "plain" or (went and kind == "if"):
            return False
        self.sent[run_id] = "plain" if kind == "plain" else went or kind
        return True


class _Open(threading.local):
    commit: _Commit | None = None


_open = _Open()  # per thread, as Django's connections are


def _commit() -> _Commit:
    """The nudges of the open transaction's commit: a new one once the last one's callbacks ran (a
    rolled-back transaction's never run, and are taken over empty by the next)."""
    if _open.commit is None or _open.commit.running:
        _open.commit = _Commit()
    return _open.commit


def process_run(run_id: int) -> None:
    """A run's status may have changed with its jobs (process_run): once per transaction however
    many of its jobs moved in it."""
    if not transaction.get_connection().in_atomic_block:
        _gather("process_run", run_id) or registered.process_run.delay(run_id)
        return
    commit = _commit()

    def send() -> None:
        if commit.first(run_id, "plain"):
            _gather("process_run", run_id) or registered.process_run.delay(run_id)

    transaction.on_commit(send)


def process_run_if(run_id: int, due: Callable[[], bool]) -> None:
    """process_run, once the transaction has committed, only if `due()` then says so.

    For a move that matters to the run only when it is the last of its kind (a job ending without
    a failure while others of its run still run): `due` looks after commit, so of two moves that
    commit together the later one's look sees both, and at least one of them sends. A nudge this
    transaction sends earlier makes it needless; a plain nudge after it still goes."""
    commit = _commit() if transaction.get_connection().in_atomic_block else _Commit()

    def send() -> None:
        if commit.first(run_id, "if") and due():
            _gather("process_run", run_id) or registered.process_run.delay(run_id)

    transaction.on_commit(send)


def sync_routers(run_id: int, countdown: float = 0) -> None:
    """A routed service's ready set changed: its routers' worker lists may be brought in line (sync_routers)."""
    if countdown:
        transaction.on_commit(lambda: registered.sync_routers.apply_async((run_id,), countdown=countdown))
    else:
        transaction.on_commit(lambda: registered.sync_routers.delay(run_id))


def admit_fleet(fleet_id: int, countdown: float = 0) -> None:
    """A fleet got hosts back: its admission look chooses the waiting runs they go to (admit_fleet)."""
    if countdown:
        transaction.on_commit(lambda: registered.admit_fleet.apply_async((fleet_id,), countdown=countdown))
    else:
        transaction.on_commit(lambda: registered.admit_fleet.delay(fleet_id))


def terminate_group(group_id: int) -> None:
    """An instance group marked terminating may be deleted with its backend (terminate_group)."""
    transaction.on_commit(lambda: registered.terminate_group.delay(group_id))


def poll_pod(group_id: int, countdown: float) -> None:
    """A slice being created is due another look at the cloud's side (poll_pod)."""
    if countdown:
        transaction.on_commit(lambda: registered.poll_pod.apply_async((group_id,), countdown=countdown))
    else:
        transaction.on_commit(lambda: registered.poll_pod.delay(group_id))


def register_fleet(fleet_id: int, actor: str = "server") -> None:
    """A pending SSH fleet's hosts may be contacted and the fleet activated or failed (register_fleet)."""
    transaction.on_commit(lambda: registered.register_fleet.delay(fleet_id, actor))


def delete_fleet(fleet_id: int, actor: str = "server") -> None:
    """A fleet marked terminating may have its hosts stopped and removed, then go (delete_fleet)."""
    transaction.on_commit(lambda: registered.delete_fleet.delay(fleet_id, actor))


def stop_agents(instance_ids: list[int]) -> None:
    """Hosts taken out of their fleet may have their runner agents stopped (stop_agents, best effort)."""
    if instance_ids:
        transaction.on_commit(lambda: registered.stop_agents.delay(list(instance_ids)))


def stop_registered_agents(hosts: list[dict]) -> None:
    """Runner agents a registration started, on hosts whose fleet is gone, may be stopped
    (stop_registered_agents, best effort): each host's SSH target, its key encrypted."""
    if hosts:
        transaction.on_commit(lambda: registered.stop_registered_agents.delay(list(hosts)))


def install_attach_key(grant_id: int) -> None:
    """An attach grant's line may go onto its host (install_attach_key)."""
    transaction.on_commit(lambda: registered.install_attach_key.delay(grant_id))


def revoke_attach_keys(instance_id: int) -> None:
    """Attach lines on this host are due to go (revoke_attach_keys)."""
    transaction.on_commit(lambda: registered.revoke_attach_keys.delay(instance_id))


def queued_messages() -> int | None:
    """Messages waiting in the default queue (all priority levels); None if the broker cannot say."""
    try:
        with app.pool.acquire(block=True, timeout=5) as conn:
            return conn.default_channel.queue_declare(queue=app.conf.task_default_queue, passive=True).message_count
    except Exception:  # noqa: BLE001 - a broker that cannot count must not stop the sweep
        return None
