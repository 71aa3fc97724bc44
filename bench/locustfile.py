"""Locust users for the submit scenario: each does plan then apply, as the CLI does, until N runs are in.

Started by bench/scenarios/submit.py as its own process (so Locust's CPU is not the driver's):

    python -m locust -f bench/locustfile.py --headless --host http://127.0.0.1:PORT --users 50 \
        --spawn-rate 50 --run-time 240s --muster-spec SPEC.json

SPEC.json (written by the driver): {"base": "/api/projects/<p>/", "headers": {...}, "body": "<json>",
"runs": 200, "out": "<results path>"}. The results file gets every request's time in ms per name
("plan", "apply"), the errors, the seconds from the moment every user was spawned to the last apply,
and this process's CPU seconds over that window. Locust's own stats round each time to about 2
significant digits (10 ms steps above 100 ms, 100 ms above 1 s), so the driver computes the
percentiles from these exact times instead, the same way as for its own threads.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import gevent
from gevent.event import Event
from locust import FastHttpUser, events, task
from locust.exception import StopUser

spec: dict = {}
state = {"claimed": 0, "done": 0, "t0": None, "t1": None, "cpu0": 0.0, "cpu1": None}
times: dict[str, list[float]] = {"plan": [], "apply": []}
errors: list[str] = []
go = Event()  # users wait for it so all of them start together, not along the spawn ramp


@events.init_command_line_parser.add_listener
def _options(parser):
    parser.add_argument("--muster-spec", help="bench submit spec (JSON file written by the driver)")


@events.init.add_listener
def _load(environment, **_):
    spec.update(json.loads(Path(environment.parsed_options.muster_spec).read_text()))


@events.spawning_complete.add_listener
def _all_spawned(user_count, **_):
    state["t0"], state["cpu0"] = time.perf_counter(), _cpu()
    go.set()


@events.request.add_listener
def _record(name, response_time, response=None, exception=None, **_):
    times.setdefault(name, []).append(response_time)
    if exception is not None:
        status = getattr(response, "status_code", 0)
        errors.append(f"{name}: {status} {exception!s:.200}")


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


@events.quitting.add_listener
def _write(environment, **_):
    # a time bound (--run-time) quits before the last apply: measure up to now then
    end, cpu = state["t1"] or time.perf_counter(), state["cpu1"] or _cpu()
    Path(spec["out"]).write_text(json.dumps({
        "runs": state["done"], "seconds": end - (state["t0"] or end), "times_ms": times, "errors": errors,
        "cpu_s": cpu - state["cpu0"]}))  # CPU of the window, not of Locust's start-up


class Submitter(FastHttpUser):
    # FastHttpUser (geventhttpclient): one keep-alive connection per user, like the bench's own
    # threads, at a fraction of the CPU of HttpUser (requests); that matters on a 2-CPU machine
    # shared with the web and the workers.

    def on_start(self):
        go.wait()

    @task
    def submit(self):
        # gevent switches only on I/O, so claiming a ticket needs no lock
        if state["claimed"] >= spec["runs"]:
            raise StopUser()
        state["claimed"] += 1
        headers, body = spec["headers"], spec["body"]
        self.client.post(spec["base"] + "runs/plan", data=body, headers=headers, name="plan")
        self.client.post(spec["base"] + "runs/", data=body, headers=headers, name="apply")
        state["done"] += 1
        if state["done"] == spec["runs"]:
            state["t1"], state["cpu1"] = time.perf_counter(), _cpu()
            # quit from another greenlet: the runner kills every user greenlet, this one included
            gevent.spawn(self.environment.runner.quit)
