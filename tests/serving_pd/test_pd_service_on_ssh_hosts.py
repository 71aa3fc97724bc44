"""The PD service on a registered SSH fleet: three real sshd hosts in their own network namespaces,
the real smg on one, stand-in prefill and decode workers on the others, submitted through the REST
API with a real worker. The router reaches the workers host to host; Muster reaches the router's
worker API from the server; a request through the endpoint goes router -> prefill -> decode, and
smg's list follows a killed decode worker out and its replacement in."""

from __future__ import annotations

import os
import signal

import pytest
import requests

from tests.conftest import token_for
from tests.engine.helpers import Beat
from tests.engine.service_helpers import wait_until
from tests.serving.replicas import free_port
from tests.serving.test_endpoint import endpoint  # noqa: F401 (the fixture)
from tests.serving_pd.processes import listed, routed
from tests.serving_pd.test_pd_service import _expected, _jobs, pd_yaml
from tests.ssh_e2e.helpers import fleet_configuration, needs_netns, registered_fleet

pytestmark = [*needs_netns, pytest.mark.smg, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_pd_service_on_ssh_hosts_keeps_smgs_list_and_routes_through_it(
        ssh_hosts, fast_limits, celery_worker, superuser_api, endpoint, django_user_model, tmp_path):  # noqa: F811
    from projects.models import Project

    pool = ssh_hosts(3, mode="netns")
    project, _ = Project.objects.get_or_create(name="main")
    fleet = registered_fleet(project, {"configuration": fleet_configuration(pool, name="svc")})
    assert fleet.status == "active", fleet.errors
    port = free_port()
    # every process listens on all its host's addresses, as a real one does (the probes knock on the
    # host's 127.0.0.1); each host is a namespace of its own, so the same port is no clash
    conf = pd_yaml("pd", port, tmp_path).replace("--host $DSTACK_NODE_IP", "--host 0.0.0.0").replace(
        "--prometheus-host $DSTACK_NODE_IP", "--prometheus-host 0.0.0.0").replace(
        "groups:\n", "fleets: [svc]\ngroups:\n", 1)
    with Beat():
        answer = superuser_api.post("/api/projects/main/runs/", {"configuration": conf}, format="json")
        assert answer.status_code == 201, answer.json()
        wait_until(lambda: set(_jobs("pd")) == {"router", "prefill", "decode"}, 120, "all three ready")
        router = _jobs("pd")["router"].instance.internal_ip
        assert {j.instance.internal_ip for j in _jobs("pd").values()} == {h.address for h in pool}
        wait_until(lambda: listed(router, port) == _expected("pd", port) and len(_expected("pd", port)) == 2, 60,
                   "smg lists both workers")
        wait_until(lambda: routed("pd"), 10, "the endpoint routes to the router")
        key = token_for(django_user_model.objects.get(username="root"))
        where, auth = f"{endpoint.url}/proxy/services/main/pd/", {"Authorization": f"Bearer {key}"}
        got = requests.post(where + "generate", json={"text": "over ssh"}, headers=auth, timeout=30)
        assert got.status_code == 200 and got.json()["meta_info"]["prefill"]["prefill"].startswith("prefill@"), got.text
        decode = _jobs("pd")["decode"]
        os.kill(int((tmp_path / f"{decode.instance.internal_ip}.pid").read_text()), signal.SIGKILL)
        wait_until(lambda: "decode" not in {g for _, g in listed(router, port)}, 60, "the killed decode out")
        wait_until(lambda: (j := _jobs("pd").get("decode")) is not None and j.pk != decode.pk, 120, "replaced")
        wait_until(lambda: listed(router, port) == _expected("pd", port) and len(_expected("pd", port)) == 2, 60,
                   "the replacement listed")
