"""A TPU slice in the console: its run's nodes drawn inside one pod box, its hosts grouped under the
pod on the fleets page. The slice is made by the real google-cloud-tpu client against
tests/fake_tpu/, its hosts are namespace sshd hosts (tests/tpu_e2e/conftest.py)."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from instances.models import InstanceGroup
from tests.engine.helpers import wait_for_run
from tests.tpu_e2e.conftest import gcp, make_fleet, submit, tpu_hosts  # noqa: F401
from tests.tpu_e2e.helpers import needs_netns, tpu_task

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.netns, pytest.mark.slow, needs_netns]


def test_a_v2_32_run_is_one_pod_box_with_its_four_hosts_and_the_fleets_page_groups_them(
        gcp, make_fleet, submit, celery_worker, django_user_model):  # noqa: F811
    make_fleet()
    run = wait_for_run(submit(tpu_task("tpu-console")), timeout=120)
    assert run.status == "done"
    [pod] = InstanceGroup.objects.filter(kind="tpu_pod")
    alice = django_user_model.objects.get(username="alice")
    alice.set_password("alice-console-pw-1")
    alice.save()
    browser = Client()
    assert browser.post("/login/", {"username": "alice", "password": "alice-console-pw-1"}).status_code == 302

    page = browser.get("/projects/main/runs/tpu-console/").content.decode()
    svg = page[page.index("<svg"):page.index("</svg>")]
    assert svg.count(f"TPU pod {pod.name} (v2-32)") == 1, "one pod box for the slice"
    assert svg.count('class="node"') == 4
    # every node drawn after (inside) the pod's box, with its host's IP and TPU
    after_pod = svg[svg.index(f"TPU pod {pod.name}"):]
    for inst in pod.instances.all():
        assert f"IP {inst.internal_ip}" in after_pod

    fleets = browser.get("/projects/main/fleets/").content.decode()
    section = fleets[fleets.index(f"TPU pod {pod.name}"):]
    assert re.search(r"v2-32 · active · 4 hosts", section)
    for inst in pod.instances.all():
        assert inst.name in section
