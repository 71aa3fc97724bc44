"""Flex-start queued resources end to end: the real TPU client against the fake TPU API (which
reclaims a flex-start slice at its end as Google documents), namespace sshd hosts as the TPU VMs,
runs through the REST API with a real worker, and `muster ps`'s table from the API's answer."""

from __future__ import annotations

import time

import pytest

from cli.render import runs_table
from tests.engine.helpers import wait_for_run
from tests.tpu_e2e.helpers import needs_netns, tpu_task
from tests.tpu_e2e.test_pod_preemption import pod_watch  # noqa: F401 (beat's watch_pods ticks)
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.netns, pytest.mark.slow, needs_netns]

FLEX = {"provisioning_model": "flex-start", "max_run_duration": "8s"}


def _jobs(api, name: str) -> list[dict]:
    return api.get(f"/api/projects/main/runs/{name}/").json()["jobs"]


def test_a_flex_start_run_that_outlives_its_slice_ends_as_an_interruption(
        gcp, make_fleet, submit, api, celery_worker, beat, pod_watch):  # noqa: F811
    make_fleet(queued_resource=FLEX)
    name = submit(tpu_task("flex-long", "v4-8", commands=["sleep 90"]))

    wait_until(lambda: [j["status"] for j in _jobs(api, name)] == ["running"], 60, "the job running")
    [job] = _jobs(api, name)
    [body] = gcp.queued_bodies.values()
    # the request carries Google's flex-start fields and no spot tier
    assert body["provisioningModel"] == "FLEX_START" and body["runDuration"] == {"maxRunDuration": "8s"}
    assert "spot" not in body
    assert job["deadline"], job
    runs = api.get("/api/projects/main/runs/").json()
    assert "flex-start ends" in runs_table(runs), runs_table(runs)

    run = wait_for_run(name, timeout=60)

    [job] = run.current_jobs()
    assert gcp.flex_reclaimed, (run.status, job.status, job.termination_reason, job.termination_message)
    assert run.status == "failed"
    assert job.termination_reason == "interrupted_by_no_capacity"  # the `interruption` retry event
    assert "flex-start max_run_duration" in job.termination_message, job.termination_message
    wait_until(lambda: not gcp.queued, 30, "the suspended request deleted")


def test_a_flex_start_run_that_ends_in_time_is_done(gcp, make_fleet, submit, api, celery_worker):
    make_fleet(queued_resource={"provisioning_model": "flex-start", "max_run_duration": "1h"})

    started = time.time()
    run = wait_for_run(submit(tpu_task("flex-short", "v4-8")), timeout=60)

    [job] = run.current_jobs()
    assert run.status == "done", (job.status, job.termination_reason, job.termination_message)
    assert not gcp.flex_reclaimed
    [pod_row] = api.get("/api/projects/main/instance-groups/").json()
    deadline = pod_row["queued_resource"]["deadline"]
    assert started + 3600 - 5 < deadline < time.time() + 3600 + 5


@pytest.mark.parametrize(("queued", "spot", "said"), [
    (FLEX, {"spot_policy": "spot"}, "flex-start is not spot"),
    ({"provisioning_model": "flex-start"}, {}, "needs max_run_duration"),
    ({"provisioning_model": "flex-start", "max_run_duration": "8d"}, {}, "at most 7d"),
    ({"max_run_duration": "1h"}, {}, "max_run_duration is for provisioning_model"),
])
def test_bad_flex_start_fleets_are_a_400_naming_the_field(api, queued, spot, said):
    import yaml

    from tests.conftest import example

    conf = {**yaml.safe_load(example("tpu-fleet.yml")), "queued_resource": queued, **spot}
    conf.pop("spot", None) if spot else None

    response = api.post("/api/projects/main/fleets/", {"configuration": conf}, format="json")

    assert response.status_code == 400, response.content
    text = response.content.decode()
    assert "queued_resource" in text and said in text, text
