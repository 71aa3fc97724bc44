"""sync_routers: a PD service's router replicas made to list exactly its ready workers (the rules:
serving/router_sync.py; docs/services.md, "PD services").

A claimed step per run on its own row (serving.models.RouterSync), so it never waits on process_run
nor holds it up. Sent after commit by every move that changes a routed service's ready set
(engine/nudges.py: a worker ready or no longer, drained, a router ready again after a restart), and
by beat every MUSTER_ROUTER_SYNC_INTERVAL seconds for every live routed service (the safety net).

For each router (the router group's ready heads): GET /workers; each wanted worker not listed as it
should be is probed (its /server_info, once per sync) and added (POST /workers); each listed worker
not wanted is removed (DELETE /workers/{id}: smg drains it). Every add and remove is a run event. A
router that refuses the worker API, or a worker the router does not take (accepted, then dropped:
it answers Muster's probe but not what smg asks), is one event when it starts and one when it ends
(RouterSync.problems), and a refused worker is offered again with a back-off (RouterSync.attempts),
never in a loop. What each router lists is kept in RouterSync.listed for keep.py, which stops a
drained replica only once no router lists it; a router that does not answer keeps what it listed
before (one never heard from counts as listing every worker), so keep.py waits for it (bounded).
A router seen serving (serving/router_sync.py `serves`) since it last became ready is written to
RouterSync.routable, and the endpoints are notified (notify_routes): they route to it from then on.
One ready but not yet serving, to which this sync added a worker or which lists one it has not taken
yet (within ROUTER_TAKE_WAIT of the newest readiness), is synced again ROUTER_ROUTABLE_RECHECK later
(smg takes an added worker in the background); otherwise the beat's sweep looks again.

A router is the user's code and may answer anything: its entries are read only as far as they are
well-formed (serving/router_sync.py valid_entries), at most ROUTER_REMOVALS_PER_SYNC removals per
router per sync (the workers Muster did not register said in one event), the strings it supplies
clipped in events and its answers' bodies never echoed, each router synced on its own (one that
answers nonsense does not stop the others), and all of a sync's calls within ROUTER_SYNC_BUDGET.

Every call is serving/replica_http.py's (a deadline and a size cap; an SSH host's replicas through
its SSH connection when the server cannot reach them directly).
"""

from __future__ import annotations

import logging
import time
from functools import partial

from django.utils import timezone

from engine import claims, messages, outcome
from engine.tuning import ROUTER_ACK_CAP as ACK_CAP
from engine.tuning import ROUTER_CALL_TIMEOUT as TIMEOUT
from engine.tuning import ROUTER_LIST_CAP as LIST_CAP
from engine.tuning import ROUTER_RECHECK as RECHECK
from engine.tuning import ROUTER_REMOVALS_PER_SYNC as REMOVALS
from engine.tuning import ROUTER_ROUTABLE_RECHECK as ROUTABLE_RECHECK
from engine.tuning import ROUTER_SYNC_BUDGET as BUDGET
from engine.tuning import ROUTER_TAKE_WAIT as TAKE_WAIT
from engine.tuning import WORKER_INFO_CAP as INFO_CAP
from runs.choices import RUN_FINISHED, RunStatus
from runs.configuration.stored import run_configuration
from runs.models import Job, Run
from serving import router_sync as rules
from serving.models import RouterSync
from serving.replica_http import ReplicaHTTPError, ReplicaUnreachable, request
from serving.rows import notify_routes

log = logging.getLogger(__name__)

BACKOFF = (5, 10, 30, 60, 120, 300)  # seconds before a worker the router refused is offered again
LIVE = (RunStatus.SUBMITTED, RunStatus.PROVISIONING, RunStatus.RUNNING)
# a router's malformed answer the validation did not foresee: that router's sync ends, not the others'
MALFORMED = (ValueError, TypeError, KeyError, AttributeError, RecursionError)


def sync_routers(run_id: int) -> None:
    """The task's body: the run's row made if it has none yet, then the claimed step."""
    run = Run.objects.filter(pk=run_id).exclude(status__in=RUN_FINISHED).only("id", "configuration").first()
    if run is None or rules.router_group(run_configuration(run)) is None:
        return
    RouterSync.objects.get_or_create(run_id=run_id)
    claims.claimed(RouterSync, run_id, "sync_routers", _sync)


def sweep_routers() -> int:
    """Beat's safety net: a sync_routers message for every live routed service, each synced by the
    worker that takes it (not here, one after another: one tenant's slow routers would hold all)."""
    done = 0
    # services only, in the query: with 10,000 tasks waiting, reading and parsing every live run's
    # configuration took 2 s a sweep (bench.queueing)
    for run in Run.objects.filter(status__in=LIVE, configuration__type="service").only("id", "configuration"):
        if rules.router_group(run_configuration(run)) is not None:
            messages.sync_routers(run.pk)
            done += 1
    return done


def _sync(held: claims.Held) -> claims.Outcome:
    row = RouterSync.objects.get(pk=held.pk)
    run = Run.objects.select_related("project").get(pk=held.pk)
    conf = run_configuration(run)
    group = rules.router_group(conf)
    if group is None or run.status in RUN_FINISHED:
        return claims.Outcome(fields={"listed": {}, "problems": {}, "attempts": {}, "routable": {}})
    jobs = list(Job.objects.filter(run=run, superseded=False).select_related("instance"))
    sync = _Sync(run, conf, row, group)
    for router in rules.routers(group, jobs):
        try:
            sync.router(router, rules.workers_for(group, jobs, router))
        except MALFORMED as exc:
            log.warning("sync_routers: run %s router job %s: %r", run.pk, router.pk, exc)
            sync.unanswered(router, f"{_name(router)} answered something its worker list cannot be read from "
                                    f"({type(exc).__name__})")
    return sync.outcome(row)


def _name(router: Job) -> str:
    return f"router {router.node_group_name}/{router.replica_num} (job {router.job_num})"


def _clip(value, limit: int = 100) -> str:
    """A string a router supplied, fit for an event: printable, and short."""
    text = "".join(c if c.isprintable() else "?" for c in str(value)[:limit])
    return text + ("…" if len(str(value)) > limit else "")


class _Sync:
    def __init__(self, run: Run, conf, row: RouterSync, group):
        self.run, self.conf, self.port, self.group = run, conf, conf.port, group
        self.previous: dict[str, dict] = dict(row.listed or {})
        self.was_routable: dict[str, str] = dict(row.routable or {})
        self.routable: dict[str, str] = {}
        self.not_serving = False
        self.accepted: set[int] = set()  # routers that accepted an add this sync
        self.deadline = time.monotonic() + BUDGET
        self.events: list[dict] = []
        self.listed: dict[str, dict] = {}
        self.problems: dict[str, str] = {}
        self.attempts = {k: v for k, v in (row.attempts or {}).items()}
        self.registrations: dict[int, rules.Registration] = {}
        self.removed = False
        self.draining = False

    def say(self, message: str, job: Job | None = None) -> None:
        self.events.append(outcome.event(self.run.project_id, f"run {self.run.name}", message,
                                         status=self.run.status, run_id=self.run.pk,
                                         job_id=job.pk if job is not None else None))

    def call(self, job: Job, method: str, path: str, max_bytes: int, json=None):
        """replica_http.request within this sync's budget."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise ReplicaUnreachable(f"not asked: this sync's {BUDGET:g}s for its calls ran out")
        return request(job, self.port, method, path, json=json, timeout=min(TIMEOUT, left), max_bytes=max_bytes)

    def unanswered(self, router: Job, problem: str) -> None:
        """The router's list unknown this sync: what it listed before is kept (keep.py waits on it), and
        whether it serves too (one answer missed does not take it out of the endpoint's pool)."""
        self.problems[f"router {router.pk}"] = problem
        self.serving(router, [], None)
        self.listed[str(router.pk)] = self.previous.get(str(router.pk)) or {rules.UNANSWERED: ""}

    def router(self, router: Job, workers: list[Job]) -> None:
        name = _name(router)
        try:
            answer = self.call(router, "GET", "/workers", LIST_CAP)
        except ReplicaHTTPError as exc:
            self.unanswered(router, f"{name} cannot be reached for its worker list: {exc}")
            return
        try:
            current = answer.json()["workers"] if answer.status == 200 else None
        except (ValueError, KeyError, TypeError):
            current = None
        if not isinstance(current, list):  # its body is not echoed: whatever answers there is not shown
            self.unanswered(router, f"{name} refuses the worker API: GET /workers answered {answer.status}; is it "
                                    "smg (router: {type: smg}) without an admin key on its worker API?")
            return
        current = rules.valid_entries(current)
        serves = self.serving(router, workers, current)
        wanted = [self.registration(job) for job in workers]
        add, remove = rules.diff(current, wanted)
        by_job = {j.pk: j for j in workers}
        # Muster's own first (a drained replica waits on them), then at most REMOVALS in all
        remove.sort(key=lambda e: rules.entry_job(e) is None)
        unknown: list[str] = []
        for entry in remove[:REMOVALS]:
            self.remove(router, name, entry, by_job, unknown)
        more = f"{len(remove) - REMOVALS} more to remove, left for the next sync" if len(remove) > REMOVALS else ""
        if unknown:
            self.say(f"{name}: removed {len(unknown)} worker(s) Muster did not register (e.g. {unknown[0]})"
                     + (f"; {more}" if more else ""))
        elif more:
            self.say(f"{name}: {more}")
        added: dict[int, str] = {}
        for reg in add:
            worker_id = self.add(router, name, reg, by_job[reg.job_id])
            if worker_id:
                added[reg.job_id] = worker_id
        missing = {f"{router.pk} {reg.job_id}" for reg in add}
        for key in [k for k in self.attempts if k.split(" ")[0] == str(router.pk) and k not in missing]:
            del self.attempts[key]  # listed, or no longer wanted: its tries are over
        self.listed[str(router.pk)] = rules.listed_jobs(current, added)
        if not serves and workers and (router.pk in self.accepted or self.taking(router, workers, current)):
            self.not_serving = True  # smg takes what it accepted in the background: seen serving soon
        # looked at again soon while it drains one of Muster's workers (keep.py waits on it), not while it
        # keeps listing workers of its own however often they are removed
        self.draining |= any(rules.draining(e) and rules.entry_job(e) is not None for e in current) \
            or any(rules.entry_job(e) is not None for e in remove)

    def serving(self, router: Job, workers: list[Job], current: list[dict] | None) -> bool:
        """RouterSync.routable for `router`: kept while it is ready as it was, set once it serves (as the
        router answered before this sync's adds: what it takes in the background shows next time)."""
        mark = rules.ready_mark(router)
        if self.was_routable.get(str(router.pk)) == mark or (
                current is not None and rules.serves(self.conf, self.group, workers, current, self.port)):
            self.routable[str(router.pk)] = mark
            return True
        return False

    def taking(self, router: Job, workers: list[Job], current: list[dict]) -> bool:
        """The router lists one of `workers` it has not taken yet (smg checks it first), and they became
        ready within ROUTER_TAKE_WAIT: a worker it never takes is not looked at again and again."""
        urls = {rules.worker_url(j, self.port) for j in workers}
        newest = max(j.ready_at for j in [router, *workers] if j.ready_at is not None)
        return (timezone.now() - newest).total_seconds() < TAKE_WAIT and any(
            e["url"] in urls and not (e["healthy"] and e["status"] in ("ready", "")) for e in current)

    def registration(self, job: Job) -> rules.Registration:
        """The worker as a router should list it; its /server_info asked once per sync."""
        if job.pk not in self.registrations:
            group = self.conf.replica_group(job.node_group_name)
            override = group.worker if group is not None else None
            reported = None
            if override is None or not override.role or (override.role == "prefill" and not override.bootstrap_port):
                reported = self.server_info(job)
            role, port = rules.role_of(override, reported, job.node_group_name)
            self.registrations[job.pk] = rules.Registration(job.pk, rules.worker_url(job, self.port), role, port,
                                                            self.conf.model)
        return self.registrations[job.pk]

    def server_info(self, job: Job) -> dict | None:
        try:
            for path in ("/server_info", "/get_server_info"):  # SGLang before 0.5.6 serves only the second
                answer = self.call(job, "GET", path, INFO_CAP)
                if answer.status != 404:
                    break
            return answer.json() if answer.status == 200 else None
        except (ReplicaHTTPError, ValueError):
            return None  # not an SGLang server that says what it is: the group's name says

    def add(self, router: Job, name: str, reg: rules.Registration, job: Job) -> str | None:
        key = f"{router.pk} {job.pk}"
        # [adds the router accepted, when to offer it again, when it was first offered]
        accepted, next_at, first = ((self.attempts.get(key) or []) + [0, 0, time.time()])[:3]
        problem = f"worker {router.pk} {job.pk}"
        if next_at > time.time():
            self.problems.setdefault(problem, "")  # still failing: kept, not said again
            return None
        self.attempts[key] = [accepted, time.time() + RECHECK, first]
        where = f"job {self.run.name}/{job.job_num} ({job.node_group_name})"
        try:
            answer = self.call(router, "POST", "/workers", ACK_CAP, json=reg.body())
        except ReplicaHTTPError as exc:
            self.problems[f"router {router.pk}"] = f"{name} cannot be reached to add {reg.url}: {exc}"
            return None
        try:
            ack = answer.json()
        except ValueError:
            ack = {}
        ack = ack if isinstance(ack, dict) else {}
        not_taken = (f"{name} did not take worker {reg.url} ({where}): it answers Muster's probe but not what smg "
                     "asks of an SGLang worker (/health, /model_info, /v1/models); see the router's log")
        if answer.status == 202:
            self.accepted.add(router.pk)
            self.attempts[key] = [accepted + 1, time.time() + BACKOFF[min(accepted, len(BACKOFF) - 1)], first]
            if accepted:  # accepted before and not listed since: the router gave it up
                self.problems[problem] = not_taken
            else:
                self.say(f"{name}: added worker {reg.describe()} for {where}", job)
            return rules.worker_id(ack.get("worker_id"))
        if answer.status == 409 and ack.get("code") in ("WORKER_CREATE_IN_PROGRESS", "WORKER_ALREADY_EXISTS"):
            if time.time() - first > TAKE_WAIT:  # smg still trying it: its checks of the worker fail
                self.problems[problem] = not_taken
            else:
                self.problems.setdefault(problem, "")
            return None
        self.attempts[key] = [accepted, time.time() + BACKOFF[-1], first]
        self.problems[problem] = (
            f"{name} refused worker {reg.url} ({where}): POST /workers answered {answer.status}")
        return None

    def remove(self, router: Job, name: str, entry: dict, by_job: dict, unknown: list[str]) -> None:
        """DELETE one entry; an event for one Muster registered, `unknown` gets the others' URLs (one event)."""
        worker_id, url = entry["id"], _clip(entry["url"] or "?")
        job_id = rules.entry_job(entry)
        why = ("its job is no longer a ready worker of this router's deployment" if job_id not in by_job else
               "registered with another role or bootstrap port")
        if not worker_id:
            self.problems[f"router {router.pk}"] = f"{name} lists worker {url} with no usable id: it cannot be removed"
            return
        try:
            answer = self.call(router, "DELETE", f"/workers/{worker_id}", ACK_CAP)
        except ReplicaHTTPError as exc:
            self.problems[f"router {router.pk}"] = f"{name} cannot be reached to remove {url}: {exc}"
            return
        if answer.status not in (200, 202, 404):
            self.problems[f"router {router.pk}"] = (
                f"{name} refused to remove worker {url}: DELETE /workers/{_clip(worker_id)} answered {answer.status}")
            return
        self.removed = True
        if job_id is None:
            unknown.append(url)
        else:
            self.say(f"{name}: removed worker {url} ({why})")

    def outcome(self, row: RouterSync) -> claims.Outcome:
        old = row.problems or {}
        for key, message in self.problems.items():
            if message and old.get(key) != message and not (key.startswith("worker") and old.get(key)):
                self.say(message)
        for key, message in old.items():
            if key not in self.problems and message:
                self.say(f"resolved: {message}")
        problems = {k: (v or old.get(k, "")) for k, v in self.problems.items()}
        then = []
        if self.listed != (row.listed or {}) or self.removed:
            then.append(partial(messages.process_run, self.run.pk))  # a drained replica may be stopped now
        if self.draining:
            then.append(partial(messages.sync_routers, self.run.pk, RECHECK))
        elif self.not_serving:
            then.append(partial(messages.sync_routers, self.run.pk, ROUTABLE_RECHECK))
        if any(self.was_routable.get(k) != mark for k, mark in self.routable.items()):
            then.append(partial(notify_routes, self.run.pk))  # the endpoints route to it from now on
        return claims.Outcome(fields={"listed": self.listed, "problems": problems, "attempts": self.attempts,
                                      "routable": self.routable, "synced_at": timezone.now()},
                              events=tuple(self.events), then=tuple(then))

