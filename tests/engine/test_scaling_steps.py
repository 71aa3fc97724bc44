"""scale_service, the scaler's claimed step (engine/replicas/scaling.py), run in the test process
(no worker): which runs it takes, what it leaves and sends, a stale lease, another holder; and its
decision rule (dstack's delays, from zero at once) on its own."""

from __future__ import annotations

import pytest

from engine import claims
from engine.replicas import scaling
from events.models import Event
from runs.configuration.stored import StoredScaling
from runs.models import Run
from runs.services.submission import submit_run
from serving.stats import add_requests
from tests.engine.helpers import local_project_fleet
from tests.engine.outcome_helpers import around_body, steal

pytestmark = pytest.mark.django_db(transaction=True)

SCALED = """type: service
name: {name}
port: 8000
replicas: 0..3
scaling:
  metric: rps
  target: 2
  scale_up_delay: 0s
  scale_down_delay: 0s
commands:
  - python3 -m http.server 8000
"""


def _service(name: str = "web", text: str = SCALED) -> Run:
    fleet = local_project_fleet(size=1)
    return submit_run(fleet.project, None, {"configuration": text.format(name=name)})


@pytest.mark.step_case("scale_service", "eligibility")
@pytest.mark.step_case("scale_service", "success")
def test_scale_service_takes_scaled_services_only_and_writes_what_the_requests_ask(sent):
    scaled = _service()
    fixed = submit_run(scaled.project, None, {"configuration": SCALED.format(name="fixed").replace(
        "replicas: 0..3\nscaling:\n  metric: rps\n  target: 2\n  scale_up_delay: 0s\n  scale_down_delay: 0s\n",
        "replicas: 1\n")})
    task = submit_run(scaled.project, None, {"configuration": "type: task\nname: t\ncommands: [sleep 1]\n"})
    add_requests(scaled.pk, 1)
    sent.clear()
    assert scaling.scale_services() == 1, "only the service whose replicas follow its requests"
    scaled.refresh_from_db()
    assert scaled.desired_replicas == {"0": 1} and scaled.lease_token == ""
    assert scaled.scaling["decisions"] == 1 and [n for _, n in scaled.scaling["samples"]] == [0, 1]
    assert Event.objects.filter(run=scaled, message__startswith="scaled 0 0 → 1").exists()
    assert sent.messages == [("process_run", scaled.pk, 0, False)], "the run nudged once it is free"
    for other in (fixed, task):
        other.refresh_from_db()
        assert other.scaling == {}
    sent.clear()
    assert scaling.scale_services() == 1
    assert sent.messages == [], "nothing changed: no nudge"


@pytest.mark.step_case("scale_service", "stale")
def test_scale_service_with_a_stale_lease_writes_nothing(sent, monkeypatch):
    run = _service()
    add_requests(run.pk, 5)
    around_body(monkeypatch, scaling, "_scale", steal(Run))
    sent.clear()
    scaling.scale_services()
    run.refresh_from_db()
    assert run.desired_replicas == {"0": 0} and run.scaling == {} and run.lease_token == "someone-else"
    assert sent.messages == [] and not Event.objects.filter(run=run, message__startswith="scaled").exists()


@pytest.mark.step_case("scale_service", "contention")
def test_scale_service_does_nothing_while_another_worker_holds_the_run(sent):
    run = _service()
    add_requests(run.pk, 5)
    token = claims.claim(Run, run.pk)
    assert scaling.scale_services() == 0
    run.refresh_from_db()
    assert run.desired_replicas == {"0": 0} and run.lease_token == token
    claims.forget_all()


RULE = StoredScaling(target=10, scale_up_delay=300, scale_down_delay=600)


@pytest.mark.parametrize("rps, current, since, new, wanted", [
    (27.0, 1, 400, 5, 3),   # ceil(27 / 10) once scale_up_delay has passed
    (27.0, 1, 100, 5, 1),   # too soon after the last scaling to go up
    (500.0, 1, 400, 5, 4),  # never past the maximum
    (0.0, 3, 700, 0, 0),    # no request in the window: down to the minimum once scale_down_delay passed
    (0.0, 3, 400, 0, 3),    # too soon to go down
    (0.2, 0, 0, 1, 1),      # at zero, a request brings one up at once, whatever the delay
    (0.0, 0, 0, 0, 0),      # at zero with no request: stays there
])
def test_the_scaling_rule(rps, current, since, new, wanted):
    assert scaling.decide(rps, RULE, 0, 4, current, since, new) == wanted


QUEUE_RULE = StoredScaling(metric="queue", queue_metric="q", target=4, scale_up_delay=30, scale_down_delay=60)


@pytest.mark.parametrize("depth, current, since, wanted", [
    (17.0, 2, 40, 3),   # HPA's AverageValue: ceil(17 queued / 4 per replica) = 5, at most 3
    (9.0, 1, 40, 3),    # ceil(9 / 4)
    (8.0, 1, 40, 2),    # exactly 2 replicas' worth
    (9.0, 1, 10, 1),    # too soon after the last scaling to go up
    (0.0, 3, 70, 1),    # an empty queue: down to the minimum once scale_down_delay passed
    (0.0, 3, 40, 3),    # too soon to go down
    (0.5, 2, 70, 1),    # never below the minimum of 1
])
def test_the_queue_rule(depth, current, since, wanted):
    assert scaling.decide(depth, QUEUE_RULE, 1, 3, current, since, 0) == wanted


def test_metrics_show_a_services_replicas_and_its_scaling_decisions(sent, client, settings):
    from tests.console.test_metrics import scrape, value

    settings.MUSTER = {**settings.MUSTER, "METRICS_TOKEN": "scrape-token"}
    run = _service()
    add_requests(run.pk, 1)
    scaling.scale_services()
    samples = scrape(client)
    assert value(samples, "muster_service_replicas", project="main", service="web", state="desired") == 1
    assert value(samples, "muster_service_replicas", project="main", service="web", state="ready") == 0
    assert value(samples, "muster_service_scaling_decisions_total", project="main", service="web") == 1


@pytest.mark.step_case("scale_service", "contention")
def test_an_update_while_the_scaler_holds_the_run_is_not_undone_by_its_give_back(sent, monkeypatch):
    # the update takes no lease: it commits while scale_service holds the run, with the old deployment read
    run = _service()
    add_requests(run.pk, 5)
    updated = SCALED.format(name="web").replace("replicas: 0..3", "replicas: 2..3")
    around_body(monkeypatch, scaling, "_scale",
                lambda held: submit_run(run.project, None, {"configuration": updated, "update": True}))
    sent.clear()
    scaling.scale_services()
    run.refresh_from_db()
    assert run.deployment_num == 1 and run.desired_replicas == {"0": 2}, "the update's counts stand"
    assert run.lease_token == "" and run.scaling == {}, "given back, what the scaler learned dropped"
    assert not Event.objects.filter(run=run, message__startswith="scaled").exists()
    monkeypatch.undo()
    scaling.scale_services()  # the next interval looks again, at the new deployment
    run.refresh_from_db()
    assert run.deployment_num == 1 and run.desired_replicas == {"0": 2} and len(run.scaling["samples"]) == 2
