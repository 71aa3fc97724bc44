"""The console shows a service: on the runs list that it is one and its replicas wanted; on its page
its URL, the replicas ready of wanted, the deployment, and each replica's number and readiness."""

from __future__ import annotations

import pytest

from runs.models import Job
from tests.console.test_pages import _browser, _submit, _user

pytestmark = pytest.mark.django_db

SERVICE = "type: service\nname: web\nport: 8000\nreplicas: 2\ncommands: [python3 -m http.server 8000]\n"


def test_the_run_page_shows_the_service_url_and_each_replica_s_readiness(make_user, settings):
    settings.MUSTER = {**settings.MUSTER, "ENDPOINT_URL": "https://serve.example.com"}
    alice = _user(make_user, "alice")
    _submit(alice, SERVICE)
    Job.objects.filter(run__name="web", replica_num=1).update(status="running", ready_at="2030-01-01T00:00:00Z")
    browser = _browser(alice)
    page = browser.get("/projects/main/runs/web/").content.decode()
    assert 'href="https://serve.example.com/proxy/services/main/web/"' in page
    assert "replicas ready: <strong>1 of 2</strong>" in page and "deployment 0" in page
    assert "replica 0" in page and "replica 1" in page
    assert page.count('class="ready">ready<') == 1 and page.count('class="ready">not ready<') == 1
    listing = browser.get("/").content.decode()
    assert "service · 2 replicas wanted" in listing
