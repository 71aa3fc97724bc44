"""The Celery app. Every task lives in engine/tasks.py (CELERY_IMPORTS; an app's own tasks.py would be
found by autodiscovery, and none has one); the beat schedule is static and in code."""

from __future__ import annotations

import os

from celery import Celery
from celery.signals import task_postrun, task_prerun, worker_init
from django.conf import settings

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "muster.settings")

app = Celery("muster")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Celery's Django fixup closes every database connection after each task unless this is set, so
# each task paid for a new PostgreSQL connection (a backend process and its setup statements).
# Connections are kept instead, and recycled the way Django recycles them after a request
# (CONN_MAX_AGE, health checks): see _recycle_connections.
app.conf["CELERY_DB_REUSE_MAX"] = 1 << 62
app.autodiscover_tasks()


@task_prerun.connect
@task_postrun.connect
def _recycle_connections(**_) -> None:
    from django.db import close_old_connections

    close_old_connections()


@worker_init.connect
def _lower_priority(**_) -> None:
    # On a machine shared with the web (`muster serve`, one host), placement and watching are
    # throughput work and the API is what a user waits on: a niced worker (and its prefork
    # children, which inherit it) gives way to the web when both want the CPU, and costs nothing
    # when the machine is otherwise idle.
    nice = int(settings.MUSTER["WORKER_NICE"])
    if nice > 0:
        os.nice(nice)


def _beat_schedule() -> dict:
    every = float(settings.MUSTER["SWEEP_INTERVAL"])
    poll = float(settings.MUSTER["JOB_POLL_INTERVAL"])
    logs = float(settings.MUSTER["LOG_SWEEP_INTERVAL"])
    pods = float(settings.MUSTER["POD_POLL_INTERVAL"] or 5 * poll)
    scaling = float(settings.MUSTER["SCALING_INTERVAL"])
    routers = float(settings.MUSTER["ROUTER_SYNC_INTERVAL"])
    # `expires`: a tick that could not run in its own period is dropped, never piled up.
    return {
        "sweep": {"task": "engine.tasks.sweep", "schedule": every, "options": {"expires": every}},
        # every running job is looked at in batches (engine/running/watch.py), not by one task per job;
        # a tick waits out a short backlog (it is the only thing that watches running jobs)
        "watch": {"task": "engine.tasks.watch_running", "schedule": poll, "options": {"expires": 10 * poll}},
        # live TPU pods at Google, one list per zone and fleet (engine/pod_watch.py): a preempted
        # slice is noticed within this interval, not after the SSH grace period. Like the watch it
        # is the only thing that looks at them, so a tick waits out a short backlog: dropped after
        # one interval, a busy queue dropped every tick and no preemption was noticed (make chaos)
        "pods": {"task": "engine.tasks.watch_pods", "schedule": pods, "options": {"expires": 10 * pods}},
        # each scaled service's requests sampled and its replicas set to follow them (engine/replicas/scaling.py);
        # a lost tick is made up by the next (it is its own sweep)
        "scaling": {"task": "engine.tasks.scale_services", "schedule": scaling, "options": {"expires": scaling}},
        # every routed service's router worker lists looked at (engine/router_sync.py): readiness
        # changes nudge the sync at once, this catches what a lost message or a router's restart missed
        "routers": {"task": "engine.tasks.sweep_routers", "schedule": routers, "options": {"expires": routers}},
        # finished runs' logs past MUSTER_LOG_RETENTION_DAYS (runs/log_storage.py)
        "logs": {"task": "engine.tasks.sweep_logs", "schedule": logs, "options": {"expires": logs}},
    }


app.conf.beat_schedule = _beat_schedule()
