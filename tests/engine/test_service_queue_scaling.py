"""`scaling: {metric: queue}` through the REST API with a real worker on local hosts: a decode group
whose replicas report a deep queue on their Prometheus gauge gets a second replica, and loses it
once the queue is empty, while the prefill group beside it (scaled on its own queue) stays at one;
a replica whose gauge cannot be read is left out with one event, not one per tick.

The replicas are the stand-in SGLang workers (serving/standin.py), whose `sglang:num_queue_reqs` the
test sets (`POST /standin/queue`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from events.models import Event
from runs.models import Run
from tests.engine.helpers import Beat
from tests.engine.service_helpers import apply_service, local_fleet, ready, replicas, story, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

STANDIN = Path(__file__).resolve().parents[2] / "serving" / "standin.py"


def _group(name: str) -> str:
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
      - exec python3 {STANDIN} --role {name} --port 8000 --host $DSTACK_NODE_IP
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


def _queue(job, value: float | str) -> None:
    answer = requests.post(f"http://{job.instance.internal_ip}:8000/standin/queue", json={"value": value}, timeout=5)
    assert answer.status_code == 200, answer.text


def _of(group: str, jobs) -> list:
    return [j for j in jobs if j.node_group_name == group]


def test_a_decode_group_scales_up_on_a_deep_queue_and_back_down_once_it_empties(three_hosts, celery_worker, api):
    conf = (f"type: service\nname: pd\nport: 8000\nprobes:\n  - type: http\n    url: /health\n    interval: 1s\n"
            f"groups:\n{_group('prefill')}{_group('decode')}")
    apply_service(api, conf)
    wait_until(lambda: len(ready("pd")) == 2, 60, "one prefill and one decode replica ready")
    first = _of("decode", ready("pd"))[0]
    with ScalingBeat():
        wait_until(lambda: (Run.objects.get(name="pd").scaling.get("queue_depth") or {}).get("decode") == 0, 30,
                   "the empty queues read")
        _queue(first, 10)  # ceil(10 / 4) = 3, within 1..2: 2
        wait_until(lambda: len(_of("decode", ready("pd"))) == 2, 60, "a second decode replica ready")
        run = Run.objects.get(name="pd")
        assert run.desired_replicas == {"prefill": 1, "decode": 2}, "prefill, its queue empty, stays at one"
        # the window's mean: 10, or 5 while it still holds the tick before (ceil(5 / 4) = 2 too)
        assert Event.objects.filter(run=run, message__regex=r"^scaled decode 1 → 2: a queue of (10|5)\.0 against a "
                                                            r"target of 4 per replica$").exists(), story()
        _queue(first, 0)
        wait_until(lambda: len(_of("decode", [j for j in replicas("pd") if j.status == "running"])) == 1, 60,
                   "the second decode replica drained and stopped")
        run = Run.objects.get(name="pd")
        assert run.desired_replicas == {"prefill": 1, "decode": 1}
        gone = [j for j in _of("decode", replicas("pd")) if j.status != "running"]
        assert gone and all(j.drain_at is not None for j in gone), "out of the pool (and routers) before its stop"
        # the window's mean at that tick: 0, or what is left of the deep queue's ticks in it (at most 4:
        # ceil(4 / 4) = 1) on a machine slow enough to scale down before the window emptied
        down = Event.objects.filter(run=run, message__startswith="scaled decode 2 → 1: a queue of ").first()
        assert down is not None, story()
        assert float(down.message.split("a queue of ")[1].split()[0]) <= 4, down.message

        # a gauge that says no number (NaN): left out, one event however many ticks, nothing scaled
        kept = _of("decode", ready("pd"))[0]
        _queue(kept, "nan")
        failing = Event.objects.filter(run=run, message__startswith=f"cannot read the queue of replica decode/"
                                                                     f"{kept.replica_num}")
        wait_until(failing.exists, 20, "the failing scrape said")
        decisions = int(Run.objects.get(name="pd").scaling["decisions"])
        wait_until(lambda: Run.objects.get(name="pd").scaling.get("queue_depth", {}).get("decode") is None, 20,
                   "the decode queue not known once the window has no sample")
        assert failing.count() == 1 and "has no number for sglang:num_queue_reqs" in failing.get().message
        _queue(kept, 0)
        wait_until(Event.objects.filter(run=run, message__startswith="the queue of replica decode/").exists, 20,
                   "the scrape back")
    run = Run.objects.get(name="pd")
    assert run.desired_replicas == {"prefill": 1, "decode": 1} and int(run.scaling["decisions"]) == decisions
