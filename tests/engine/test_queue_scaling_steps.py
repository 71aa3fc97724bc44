"""scale_service on a `metric: queue` group, run in the test process against a real HTTP server on
the replica's address: the gauge read and the group scaled on it; an endless answer cut at the size
cap, left out with one event, the group not scaled on a queue it could not read; an rps group beside
it untouched by it; a replica hanging on its /metrics holds neither the run (a stop is applied
meanwhile) nor the other replicas' scrapes. (The step's four cases are test_scaling_steps.py's: the
step is the same.)"""

from __future__ import annotations

import http.server
import threading
import time

import pytest
from django.db import connection
from django.utils import timezone

from engine import processing, tuning
from engine.replicas import scaling
from events.models import Event
from runs.models import Job, Run
from runs.services.submission import submit_run
from runs.transitions import request_stop
from tests.engine.helpers import local_project_fleet
from tests.serving.replicas import free_port

pytestmark = pytest.mark.django_db(transaction=True)


def _conf(port: int, decode: int = 1) -> str:
    return f"""type: service
name: pd
port: {port}
groups:
  - name: decode
    replicas: {decode}..3
    scaling: {{metric: queue, queue_metric: "sglang:num_queue_reqs", target: 4, window: 1m,
              scale_up_delay: 0s, scale_down_delay: 0s}}
    commands: [serve]
  - name: web
    replicas: 1..2
    scaling: {{metric: rps, target: 100, scale_up_delay: 0s, scale_down_delay: 1h}}
    commands: [serve]
"""


class Metrics:
    """A replica's /metrics on its own address: `answer` is the gauge's text, or None for an endless body;
    `hang`: it says nothing until `released` (`asked` once a scrape came)."""

    def __init__(self, host: str, port: int):
        self.answer: str | None = "sglang:num_queue_reqs 0\n"
        self.hang = False
        self.asked, self.released = threading.Event(), threading.Event()
        metrics = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                metrics.asked.set()
                if metrics.hang:
                    metrics.released.wait(60)
                self.send_response(200)
                self.end_headers()
                try:
                    if metrics.answer is not None:
                        self.wfile.write(metrics.answer.encode())
                        return
                    while True:  # no length, never ends: only the reader's cap stops it
                        self.wfile.write(b"# " + b"x" * 65536 + b"\n")
                except OSError:
                    pass

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer((host, port), Handler)
        self.server.protocol_version = "HTTP/1.0"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def replica(sent):
    fleet = local_project_fleet(size=2)
    instance = fleet.instances.order_by("id").first()
    port = free_port(instance.internal_ip)
    run = submit_run(fleet.project, None, {"configuration": _conf(port)})
    decode = Job.objects.get(run=run, node_group_name="decode")
    Job.objects.filter(pk=decode.pk).update(status="running", instance=instance, ready_at=timezone.now())
    server = Metrics(instance.internal_ip, port)
    yield run, decode, server
    server.close()


def test_the_queue_gauge_is_read_and_the_group_scaled_on_it(replica):
    run, decode, server = replica
    server.answer = ('# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{tp_rank="0"} 6\n'
                     'sglang:num_queue_reqs{tp_rank="1"} 4\n')
    assert scaling.scale_services() == 1
    run.refresh_from_db()
    assert run.desired_replicas == {"decode": 3, "web": 1}, "ceil(10 / 4) = 3; web follows its rps, not the queue"
    assert run.scaling["queue_depth"] == {"decode": 10.0} and run.scaling["queue"]["decode"][0][1] == 10.0
    assert Event.objects.filter(run=run, message="scaled decode 1 → 3: a queue of 10.0 against a target of 4 "
                                                 "per replica").exists()


def test_an_endless_answer_is_cut_left_out_and_said_once(replica):
    run, decode, server = replica
    server.answer = None
    for _ in range(3):
        scaling.scale_services()
    run.refresh_from_db()
    assert run.desired_replicas == {"decode": 1, "web": 1}, "a queue not read is not an empty one"
    assert run.scaling["queue_depth"] == {"decode": None} and str(decode.pk) in run.scaling["unscraped"]
    said = Event.objects.filter(run=run, message__startswith=f"cannot read the queue of replica decode/"
                                                             f"{decode.replica_num}")
    assert said.count() == 1 and "is over 4 MiB" in said.get().message
    server.answer = "sglang:num_queue_reqs 0\n"
    scaling.scale_services()
    run.refresh_from_db()
    assert run.scaling["unscraped"] == {} and run.scaling["queue_depth"] == {"decode": 0.0}
    assert Event.objects.filter(run=run, message__startswith="the queue of replica decode/").count() == 1


def _in_background(call):
    """`call()` on a thread of its own (its own database connection, closed after); join() -> its result."""
    result: list = []

    def run():
        try:
            result.append(call())
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def join():
        thread.join(30)
        assert not thread.is_alive() and result, "the scaler's tick did not end"
        return result[0]
    return join


def test_a_replica_hanging_on_its_metrics_does_not_hold_the_run_a_stop_is_applied_meanwhile(replica):
    run, decode, server = replica
    server.hang = True
    tick = _in_background(scaling.scale_services)
    assert server.asked.wait(10), "the scaler scraped the replica"
    assert Run.objects.get(pk=run.pk).lease_token == "", "the run is not held while its replica is asked"
    request_stop(run)
    assert processing.process_run(run.pk), "process_run claims the run while the scrape hangs"
    run.refresh_from_db()
    assert run.status == "terminating" and decode.__class__.objects.get(pk=decode.pk).status == "terminating"
    server.released.set()
    assert tick() == 0, "a run stopping is not scaled: the scrape is not taken"
    run.refresh_from_db()
    assert run.desired_replicas == {"decode": 1, "web": 1} and run.scaling == {}


def test_a_hanging_replica_costs_its_own_timeout_not_the_others_scrapes(sent, monkeypatch):
    fleet = local_project_fleet(size=2)
    first, second = fleet.instances.order_by("id")
    port = free_port(first.internal_ip)
    run = submit_run(fleet.project, None, {"configuration": _conf(port, decode=2)})
    jobs = list(Job.objects.filter(run=run, node_group_name="decode").order_by("job_num"))
    for job, instance in zip(jobs, (first, second), strict=True):
        Job.objects.filter(pk=job.pk).update(status="running", instance=instance, ready_at=timezone.now())
    hung, busy = Metrics(first.internal_ip, port), Metrics(second.internal_ip, port)
    try:
        hung.hang, busy.answer = True, "sglang:num_queue_reqs 9\n"
        # one timeout is the whole budget: asked one after the other, the replica after the hung one is never asked
        monkeypatch.setattr(tuning, "SCRAPE_TICK_BUDGET", tuning.SCRAPE_TIMEOUT)
        started = time.monotonic()
        assert scaling.scale_services() == 1
        took = time.monotonic() - started
    finally:
        hung.close()
        busy.close()
    run.refresh_from_db()
    assert took < 2 * tuning.SCRAPE_TIMEOUT, f"the tick took {took:.1f}s"
    assert run.scaling["queue_depth"] == {"decode": 18.0}, "9 from the one that answered, for both replicas"
    assert run.desired_replicas == {"decode": 3, "web": 1}, "ceil(18 / 4) = 5, at most 3"
    assert list(run.scaling["unscraped"]) == [str(jobs[0].pk)]
    assert Event.objects.filter(run=run, message__startswith=f"cannot read the queue of replica decode/"
                                                             f"{jobs[0].replica_num}: no answer").exists()


def test_a_stored_metrics_path_that_cannot_be_sent_is_a_failed_scrape_not_a_failed_tick(replica):
    run, decode, server = replica
    # stored before the rule refused it at submit (printable ASCII only): the tick must go on
    conf = run.configuration
    conf["groups"][0]["scaling"]["metrics_path"] = "/\u6307\u6807"
    Run.objects.filter(pk=run.pk).update(configuration=conf)
    assert scaling.scale_services() == 1
    run.refresh_from_db()
    assert run.scaling["queue_depth"] == {"decode": None} and str(decode.pk) in run.scaling["unscraped"]
    said = Event.objects.get(run=run, message__startswith="cannot read the queue of replica decode/")
    assert "request path" in said.message
