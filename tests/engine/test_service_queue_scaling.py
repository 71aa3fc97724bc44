"""`scaling: {metric: queue}` through the REST API with a real worker on local hosts: a decode group
whose replicas report a deep queue on their Prometheus gauge gets a second replica, and loses it
once the queue is empty, while the prefill group beside it (scaled on its own queue) stays at one;
a replica whose gauge cannot be read is left out with one event, not one per tick.

The replicas are a few lines of stdlib Python serving SGLang's `sglang:num_queue_reqs` from a file
the test writes (`<tmp>/<the replica's address>/queue`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from events.models import Event
from runs.models import Run
from tests.engine.helpers import Beat
from tests.engine.service_helpers import apply_service, local_fleet, ready, replicas, story, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

GAUGE_SERVER = '''
import http.server, pathlib, sys
here = pathlib.Path.cwd()
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/metrics":
            body = ("# HELP sglang:num_queue_reqs The number of requests in the waiting queue\\n"
                    "# TYPE sglang:num_queue_reqs gauge\\n"
                    'sglang:num_queue_reqs{model_name="m",tp_rank="0"} ' + (here / "queue").read_text().strip() + "\\n")
        else:
            body = "ok\\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), Handler).serve_forever()
'''


def _group(name: str, tmp: Path) -> str:
    return f"""  - name: {name}
    replicas: 1..2
    scaling:
      metric: queue
      queue_metric: sglang:num_queue_reqs
      target: 4
      window: 1s
      scale_up_delay: 0s
      scale_down_delay: 0s
    commands:
      - mkdir -p {tmp}/$DSTACK_NODE_IP && cd {tmp}/$DSTACK_NODE_IP && echo 0 > queue && echo {name} > role
      - exec python3 {tmp}/gauge.py $DSTACK_NODE_IP 8000
"""


class ScalingBeat(Beat):
    """Beat's sweep and its scaling tick (muster/celery.py), sent to the worker."""

    def tick(self) -> None:
        from engine import tasks

        super().tick()
        tasks.scale_services.apply_async(expires=5)


@pytest.fixture
def three_hosts(fast_limits, settings):
    settings.MUSTER = {**settings.MUSTER, "DRAIN_DELAY": 1}
    fleet, end = local_fleet(3)
    yield fleet
    end()


def _queue(tmp: Path, job, value: str) -> None:
    (tmp / job.instance.internal_ip / "queue").write_text(value + "\n")


def _of(group: str, jobs) -> list:
    return [j for j in jobs if j.node_group_name == group]


def test_a_decode_group_scales_up_on_a_deep_queue_and_back_down_once_it_empties(three_hosts, celery_worker, api,
                                                                                tmp_path):
    (tmp_path / "gauge.py").write_text(GAUGE_SERVER)
    conf = (f"type: service\nname: pd\nport: 8000\nprobes:\n  - type: http\n    url: /health\n    interval: 1s\n"
            f"groups:\n{_group('prefill', tmp_path)}{_group('decode', tmp_path)}")
    apply_service(api, conf)
    wait_until(lambda: len(ready("pd")) == 2, 60, "one prefill and one decode replica ready")
    first = _of("decode", ready("pd"))[0]
    with ScalingBeat():
        wait_until(lambda: (Run.objects.get(name="pd").scaling.get("queue_depth") or {}).get("decode") == 0, 30,
                   "the empty queues read")
        _queue(tmp_path, first, "10")  # ceil(10 / 4) = 3, within 1..2: 2
        wait_until(lambda: len(_of("decode", ready("pd"))) == 2, 60, "a second decode replica ready")
        run = Run.objects.get(name="pd")
        assert run.desired_replicas == {"prefill": 1, "decode": 2}, "prefill, its queue empty, stays at one"
        # the window's mean: 10, or 5 while it still holds the tick before (ceil(5 / 4) = 2 too)
        assert Event.objects.filter(run=run, message__regex=r"^scaled decode 1 → 2: a queue of (10|5)\.0 against a "
                                                            r"target of 4 per replica$").exists(), story()
        _queue(tmp_path, first, "0")
        wait_until(lambda: len(_of("decode", [j for j in replicas("pd") if j.status == "running"])) == 1, 60,
                   "the second decode replica drained and stopped")
        run = Run.objects.get(name="pd")
        assert run.desired_replicas == {"prefill": 1, "decode": 1}
        gone = [j for j in _of("decode", replicas("pd")) if j.status != "running"]
        assert gone and all(j.drain_at is not None for j in gone), "out of the pool (and routers) before its stop"
        assert Event.objects.filter(run=run, message__startswith="scaled decode 2 → 1: a queue of 0.0").exists()

        # a gauge that says no number: left out, one event however many ticks, nothing scaled
        kept = _of("decode", ready("pd"))[0]
        _queue(tmp_path, kept, "busy")
        failing = Event.objects.filter(run=run, message__startswith=f"cannot read the queue of replica decode/"
                                                                     f"{kept.replica_num}")
        wait_until(failing.exists, 20, "the failing scrape said")
        decisions = int(Run.objects.get(name="pd").scaling["decisions"])
        wait_until(lambda: Run.objects.get(name="pd").scaling.get("queue_depth", {}).get("decode") is None, 20,
                   "the decode queue not known once the window has no sample")
        assert failing.count() == 1 and "has no number for sglang:num_queue_reqs" in failing.get().message
        _queue(tmp_path, kept, "0")
        wait_until(Event.objects.filter(run=run, message__startswith="the queue of replica decode/").exists, 20,
                   "the scrape back")
    run = Run.objects.get(name="pd")
    assert run.desired_replicas == {"prefill": 1, "decode": 1} and int(run.scaling["decisions"]) == decisions
