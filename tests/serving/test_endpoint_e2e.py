"""A service submitted through the REST API, placed by a real worker on local instances, its replicas
real `python3 -m http.server` processes probed ready by their runners, and reached through the
endpoint process: both replicas answer, a request without a token is refused, and a stop empties
the pool."""

from __future__ import annotations

import pytest
import requests

from tests.conftest import token_for
from tests.engine.helpers import local_project_fleet, wait_for_run
from tests.serving.replicas import free_port
from tests.serving.test_endpoint import endpoint  # noqa: F401 (the fixture)
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SERVICE = """
type: service
name: hello
port: {port}
replicas: 2
commands:
  - mkdir -p {tmp}/$DSTACK_NODE_IP && cd {tmp}/$DSTACK_NODE_IP
  - echo "replica at $DSTACK_NODE_IP" > index.html
  - exec python3 -m http.server {port} --bind $DSTACK_NODE_IP
probes:
  - type: http
    url: /
    interval: 1s
"""


def test_a_service_submitted_through_the_api_is_served_by_both_its_replicas(
        fast_limits, celery_worker, superuser_api, endpoint, django_user_model, tmp_path):  # noqa: F811
    local_project_fleet(size=2)
    conf = SERVICE.format(port=free_port(), tmp=tmp_path)
    answer = superuser_api.post("/api/projects/main/runs/", {"configuration": conf}, format="json")
    assert answer.status_code == 201, answer.json()
    wait_until(lambda: superuser_api.get("/api/projects/main/runs/hello/").json()["service"]["replicas"]["ready"] == 2,
               timeout=90, what="both replicas ready")
    key = token_for(django_user_model.objects.get(username="root"))
    where = f"{endpoint.url}/proxy/services/main/hello/"
    assert requests.get(where, timeout=10).status_code == 401
    auth = {"Authorization": f"Bearer {key}"}

    def answers() -> set[str]:
        return {requests.get(where, headers=auth, timeout=10).text.strip() for _ in range(8)}

    seen = wait_until(lambda: (got := answers()) and len(got) == 2 and got, timeout=15, what="both replicas answering")
    assert all(text.startswith("replica at 127.") for text in seen), seen
    assert superuser_api.post("/api/projects/main/runs/hello/stop", {}, format="json").status_code in (200, 202)
    wait_until(lambda: requests.get(where, headers=auth, timeout=10).status_code in (503, 404), timeout=30,
               what="no replica once stopped")
    wait_for_run("hello", timeout=60)
