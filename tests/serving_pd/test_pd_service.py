"""A PD service end to end: the real `smg` router in front of stand-in SGLang workers
(serving/standin.py), each a replica on a local host, applied through the REST API with a real
Celery worker, reached through the endpoint process. A request goes router -> prefill -> decode;
smg lists exactly the ready workers after the start, after a worker is killed and after its
replacement is ready; stopping the run leaves nothing running."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
import requests

from events.models import Event
from runs.models import Run
from tests.conftest import example, token_for
from tests.engine.helpers import Beat, local_project_fleet
from tests.engine.service_helpers import ready, replicas, wait_until
from tests.serving.replicas import free_port
from tests.serving.test_endpoint import endpoint  # noqa: F401 (the fixture)
from tests.serving_pd.processes import STANDIN, listed, routed, smg_binary

pytestmark = [pytest.mark.smg, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def pd_yaml(name: str, port: int, tmp: Path, decode: int = 1) -> str:
    """The seed's layout as a service: smg in front of a prefill and a decode stand-in. Each replica
    writes its pid where the test finds it (its host's address), then becomes its server (exec)."""
    standin = f"{sys.executable} {STANDIN} --host $DSTACK_NODE_IP --port {port}"
    pid = f"echo $$ > {tmp}/$DSTACK_NODE_IP.pid"
    probe = "    probes:\n      - type: http\n        url: /health\n        interval: 1s\n        timeout: 1s\n"
    return f"""type: service
name: {name}
port: {port}
retry:
  on_events: [error]
  duration: 1h
groups:
  - name: router
    replicas: 1
    router:
      type: smg
    commands:
      - {pid}
      - exec {smg_binary()} launch --host $DSTACK_NODE_IP --port {port} --pd-disaggregation --prometheus-host $DSTACK_NODE_IP --prometheus-port {free_port()} --log-level warn
{probe}  - name: prefill
    replicas: 1
    commands:
      - {pid}
      - exec {standin} --role prefill --bootstrap-port {free_port()}
{probe}  - name: decode
    replicas: {decode}
    commands:
      - {pid}
      - exec {standin} --role decode
{probe}"""


def _jobs(name: str) -> dict[str, object]:
    return {j.node_group_name: j for j in ready(name)}


def _expected(name: str, port: int) -> set[tuple[str, str]]:
    return {(f"http://{j.instance.internal_ip}:{port}", group) for group, j in _jobs(name).items() if group != "router"}


def test_a_pd_service_routes_through_smg_and_its_worker_list_follows_the_ready_workers(
        fast_limits, celery_worker, superuser_api, endpoint, django_user_model, tmp_path):  # noqa: F811
    local_project_fleet(size=3)
    port = free_port()
    answer = superuser_api.post("/api/projects/main/runs/", {"configuration": pd_yaml("pd", port, tmp_path)},
                                format="json")
    assert answer.status_code == 201, answer.json()
    assert not [w for w in answer.json().get("warnings", []) if "router" in str(w)], "smg's list is kept: no warning"
    wait_until(lambda: set(_jobs("pd")) == {"router", "prefill", "decode"}, 90, "router, prefill and decode ready")
    router = _jobs("pd")["router"].instance.internal_ip
    wait_until(lambda: listed(router, port) == _expected("pd", port) and len(_expected("pd", port)) == 2, 30,
               "smg lists the prefill and the decode worker")
    wait_until(lambda: routed("pd") == {_jobs("pd")["router"].pk}, 10, "the endpoint routes to the router")
    key = token_for(django_user_model.objects.get(username="root"))
    where, auth = f"{endpoint.url}/proxy/services/main/pd/", {"Authorization": f"Bearer {key}"}
    got = requests.post(where + "generate", json={"text": "hello there"}, headers=auth, timeout=30)
    assert got.status_code == 200, got.text
    meta = got.json()["meta_info"]
    assert meta["role"] == "decode" and meta["prefill"]["prefill"].startswith("prefill@"), meta
    chat = requests.post(where + "v1/chat/completions", headers=auth, timeout=30, json={
        "model": "standin/tiny", "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["content"].startswith("stand-in decode")

    decode = _jobs("pd")["decode"]
    with Beat():
        killed = time.monotonic()
        os.kill(int((tmp_path / f"{decode.instance.internal_ip}.pid").read_text()), signal.SIGKILL)
        wait_until(lambda: ("decode" not in {g for _, g in listed(router, port)}), 30,
                   "smg no longer lists the killed decode worker")
        dropped = time.monotonic() - killed
        wait_until(lambda: (j := _jobs("pd").get("decode")) is not None and j.pk != decode.pk, 90,
                   "the decode replica replaced and ready")
        wait_until(lambda: listed(router, port) == _expected("pd", port) and len(_expected("pd", port)) == 2, 30,
                   "smg lists the replacement")
    print(f"killed decode worker out of smg's list in {dropped:.2f}s")
    got = requests.post(where + "generate", json={"text": "again"}, headers=auth, timeout=30)
    assert got.status_code == 200 and got.json()["meta_info"]["prefill"], got.text
    messages = list(Event.objects.filter(run__name="pd").values_list("message", flat=True))
    assert sum("added worker" in m for m in messages) == 3, "\n".join(messages)
    assert sum("removed worker" in m for m in messages) == 1, "\n".join(messages)

    # a router killed comes back empty: its replacement gets the whole list once it is ready
    old_router = _jobs("pd")["router"]
    with Beat():
        os.kill(int((tmp_path / f"{old_router.instance.internal_ip}.pid").read_text()), signal.SIGKILL)
        wait_until(lambda: (j := _jobs("pd").get("router")) is not None and j.pk != old_router.pk, 90,
                   "the router replaced and ready")
        router = _jobs("pd")["router"].instance.internal_ip
        wait_until(lambda: listed(router, port) == _expected("pd", port) and len(_expected("pd", port)) == 2, 30,
                   "the new router lists both workers")
        wait_until(lambda: routed("pd") == {_jobs("pd")["router"].pk}, 10, "the endpoint routes to the new router")
    got = requests.post(where + "generate", json={"text": "after the router"}, headers=auth, timeout=30)
    assert got.status_code == 200 and got.json()["meta_info"]["prefill"], got.text

    run = Run.objects.get(name="pd")
    assert superuser_api.post(f"/api/projects/main/runs/{run.name}/stop", {}, format="json").status_code in (200, 202)
    with Beat():
        wait_until(lambda: Run.objects.get(pk=run.pk).status in ("terminated", "done", "failed"), 60, "stopped")
    for job in replicas("pd"):
        pid = int((tmp_path / f"{job.instance.internal_ip}.pid").read_text())
        wait_until(lambda pid=pid: not Path(f"/proc/{pid}").exists(), 20, f"process {pid} gone")


def test_the_local_pd_service_example_answers_through_router_prefill_and_decode(
        fast_limits, celery_worker, superuser_api, endpoint, django_user_model):  # noqa: F811
    # as written, but with this checkout's stand-in and the venv's smg by path: the test's local
    # jobs have the test process's PATH, and its python3 need not be this checkout's
    conf = example("pd-disagg-local-service.yml").replace(
        "python3 -m serving.standin", f"{sys.executable} {STANDIN}").replace("exec smg ", f"exec {smg_binary()} ")
    local_project_fleet(size=3)
    answer = superuser_api.post("/api/projects/main/runs/", {"configuration": conf}, format="json")
    assert answer.status_code == 201, answer.json()
    wait_until(lambda: set(_jobs("pd-local-service")) == {"router", "prefill", "decode"}, 90, "all three ready")
    router = _jobs("pd-local-service")["router"].instance.internal_ip
    wait_until(lambda: len(listed(router, 8000)) == 2, 30, "smg lists both workers")
    wait_until(lambda: routed("pd-local-service"), 10, "the endpoint routes to the router")
    key = token_for(django_user_model.objects.get(username="root"))
    where, auth = f"{endpoint.url}/proxy/services/main/pd-local-service/", {"Authorization": f"Bearer {key}"}
    for _ in range(5):  # every request the endpoint takes goes to the router: none straight to a worker
        got = requests.post(where + "generate", json={"text": "hi"}, headers=auth, timeout=30)
        assert got.status_code == 200 and got.json()["meta_info"]["prefill"]["prefill"].startswith("prefill@"), got.text


def test_a_scaled_down_decode_worker_leaves_smgs_list_before_it_is_stopped(
        fast_limits, celery_worker, superuser_api, tmp_path):
    local_project_fleet(size=4)
    port = free_port()
    conf = pd_yaml("pd", port, tmp_path, decode=2)
    assert superuser_api.post("/api/projects/main/runs/", {"configuration": conf}, format="json").status_code == 201
    wait_until(lambda: len(ready("pd")) == 4, 90, "router, prefill and two decodes ready")
    router = _jobs("pd")["router"].instance.internal_ip
    wait_until(lambda: len(listed(router, port)) == 3, 30, "smg lists the prefill and both decodes")
    answer = superuser_api.post("/api/projects/main/runs/", {"configuration": conf.replace(
        "replicas: 2", "replicas: 1"), "update": True}, format="json")
    assert answer.status_code == 200, answer.json()
    with Beat():
        wait_until(lambda: len(listed(router, port)) == 2, 30, "smg lists one decode")
        drained = wait_until(lambda: [j for j in replicas("pd") if j.drain_at is not None and j.status in
                                      ("terminated", "terminating")], 60, "the drained decode stopped")
    url = f"http://{drained[0].instance.internal_ip}:{port}"
    events = list(Event.objects.filter(run__name="pd").order_by("id").values_list("message", flat=True))
    removed = next(i for i, m in enumerate(events) if "removed worker" in m and url in m)
    stopped = next(i for i, m in enumerate(events) if "drained: stopped" in m)
    assert removed < stopped, "\n".join(events)
