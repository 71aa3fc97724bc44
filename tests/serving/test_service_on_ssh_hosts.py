"""A service on a registered SSH fleet, end to end: two real sshd hosts in their own network
namespaces, the service submitted through the REST API, a real worker placing its two replicas (one
per host) and the endpoint process reaching both."""

from __future__ import annotations

import pytest
import requests

from tests.conftest import token_for
from tests.engine.helpers import Beat
from tests.engine.service_helpers import ready, service_yaml, wait_until
from tests.serving.replicas import free_port
from tests.serving.test_endpoint import endpoint  # noqa: F401 (the fixture)
from tests.ssh_e2e.helpers import fleet_configuration, needs_netns, registered_fleet

pytestmark = [*needs_netns, pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_two_replicas_on_ssh_hosts_are_both_reached_through_the_endpoint(
        ssh_hosts, fast_limits, celery_worker, superuser_api, endpoint, django_user_model, tmp_path):  # noqa: F811
    from projects.models import Project

    pool = ssh_hosts(2, mode="netns")
    project, _ = Project.objects.get_or_create(name="main")
    fleet = registered_fleet(project, {"configuration": fleet_configuration(pool, name="svc")})
    assert fleet.status == "active", fleet.errors
    port = free_port()
    # each replica answers /version with its host's address (the hosts share this filesystem); it
    # listens on all the host's addresses, as a real one does: the probe knocks on its 127.0.0.1
    conf = service_yaml("web", tmp_path, port=port, extra="fleets: [svc]\n").replace(
        "echo $VERSION > version", "echo $DSTACK_NODE_IP > version").replace(
        "--bind $DSTACK_NODE_IP", "--bind 0.0.0.0")
    with Beat():
        answer = superuser_api.post("/api/projects/main/runs/", {"configuration": conf}, format="json")
        assert answer.status_code == 201, answer.json()
        placed = wait_until(lambda: (r := ready("web")) and len(r) == 2 and r, 120, "two replicas ready")
    hosts = {h.address for h in pool}
    assert {j.instance.internal_ip for j in placed} == hosts, "one replica on each SSH host"
    key = token_for(django_user_model.objects.get(username="root"))
    where = f"{endpoint.url}/proxy/services/main/web/version"
    seen = set()
    for _ in range(20):
        got = requests.get(where, headers={"Authorization": f"Bearer {key}"}, timeout=30)
        assert got.status_code == 200, got.text
        seen.add(got.text.strip())
    assert seen == hosts, f"answered by {seen}, the hosts are {hosts}"
    assert requests.get(where, timeout=30).status_code == 401, "no token, no replica"
