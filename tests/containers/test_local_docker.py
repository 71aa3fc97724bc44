"""The local backend with an image: containers where the machine has Docker, a clear answer where not."""

from __future__ import annotations

import pytest

from backends.local.host import local_docker
from instances.services.fleets import create_local_fleet

pytestmark = pytest.mark.django_db


@pytest.mark.skipif(local_docker() is not None, reason="this machine's docker answers: image jobs fit here")
def test_a_local_fleet_without_docker_says_why_an_image_job_does_not_fit(api, project):
    create_local_fleet(project, "here", 1)
    text = "type: task\nimage: busybox\ncommands: [echo]\n"
    answer = api.post("/api/projects/main/runs/plan", {"configuration": text}, format="json")
    assert answer.status_code == 200, answer.content
    capacity = answer.json()["capacity"]
    assert capacity["fits"] is False
    [reason] = capacity["reasons"]
    assert reason.endswith("fleet here: no host has Docker; install docker or remove image"), capacity
    without = api.post("/api/projects/main/runs/plan", {"configuration": text.replace("image: busybox\n", "")},
                       format="json")
    assert without.json()["capacity"]["fits"] is True
