"""A 500 on the submit path, as a client on the network and one on the server's machine see it,
and as it is logged: no configuration text, no secret env value, no project secret."""

from __future__ import annotations

import logging
import sys

import pytest
from django.views.debug import ExceptionReporter
from rest_framework.test import APIClient

from runs.services import submission
from tests.conftest import token_for
from tests.test_settings_and_compose import settings_with

pytestmark = pytest.mark.django_db

PROJECT_SECRET = "hf-project-secret-4711"
REQUEST_SECRET = "request-env-secret-0815"
MARKER = "configuration-text-marker-2342"
CONF = f"""type: task
name: leaky
env:
  - HF_TOKEN=${{{{ secrets.HF_TOKEN }}}}
  - WANDB_KEY
commands: [echo {MARKER}]
"""
HIDDEN = (PROJECT_SECRET, REQUEST_SECRET, MARKER)


class Boom(RuntimeError):
    pass


@pytest.fixture
def failing_submit(make_user, monkeypatch, settings):
    """An admin of `main` with a project secret, and a fault on the submit path after the secret
    was filled in (what a bug there would do); DEBUG on, as a developer sets it."""
    settings.DEBUG = True
    alice = make_user("alice")
    key = token_for(alice)
    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert client.post("/api/projects/main/secrets/", {"name": "HF_TOKEN", "value": PROJECT_SECRET},
                       format="json").status_code == 201

    def boom(*args, **kwargs):
        raise Boom("a fault inside the submission")

    monkeypatch.setattr(submission, "new_jobs", boom)
    monkeypatch.setattr(submission, "plan_capacity", boom)
    return client, key


def _reports(caplog) -> list[str]:
    """What the django.request logger was given: the log line as the console handler prints it,
    and the report an error mail (AdminEmailHandler) would carry."""
    records = [r for r in caplog.records if r.name == "django.request" and r.exc_info]
    assert records, "the 500 was not logged"
    out = []
    for record in records:
        out.append(logging.Formatter().format(record))
        request = getattr(record, "request", None)
        out.append(ExceptionReporter(request, *record.exc_info, is_email=True).get_traceback_text())
        out.append(ExceptionReporter(request, *record.exc_info, is_email=True).get_traceback_html())
    return out


@pytest.mark.parametrize("how", ["submit-json", "plan-form"])
def test_a_500_on_the_submit_path_shows_and_logs_no_configuration_or_secret(how, failing_submit, caplog):
    client, key = failing_submit
    caplog.set_level(logging.ERROR, logger="django.request")
    if how == "submit-json":
        response = client.post("/api/projects/main/runs/", {"configuration": CONF, "env": {"WANDB_KEY": REQUEST_SECRET}},
                               format="json", HTTP_ACCEPT="text/html", REMOTE_ADDR="127.0.0.1")
    else:
        response = client.post("/api/projects/main/runs/plan", {"configuration": CONF.replace("  - WANDB_KEY\n", f"  - WANDB_KEY={REQUEST_SECRET}\n")},
                               HTTP_ACCEPT="text/html", REMOTE_ADDR="127.0.0.1")
    assert response.status_code == 500
    page = response.content.decode()
    assert "Traceback" in page and "Boom" in page  # the developer on this machine gets the technical page
    for text in [page, *_reports(caplog)]:
        for value in (*HIDDEN, key):
            assert value not in text


@pytest.mark.parametrize("client_address", [{"REMOTE_ADDR": "192.0.2.10"},
                                            # through a proxy on the server's machine
                                            {"REMOTE_ADDR": "127.0.0.1", "HTTP_X_FORWARDED_FOR": "192.0.2.10"}])
def test_a_client_on_the_network_gets_the_plain_500_even_with_debug_on(failing_submit, client_address):
    client, _ = failing_submit
    for accept in ("text/html", "application/json"):
        response = client.post("/api/projects/main/runs/", {"configuration": CONF, "env": {"WANDB_KEY": REQUEST_SECRET}},
                               format="json", HTTP_ACCEPT=accept, **client_address)
        assert response.status_code == 500
        page = response.content.decode()
        assert "Server Error (500)" in page and "Traceback" not in page and "Boom" not in page
        assert len(page) < 200


def test_debug_is_off_in_dev_mode_unless_asked_for(tmp_path):
    assert settings_with(tmp_path / "a")["debug"] is False
    assert settings_with(tmp_path / "b", DEBUG="1")["debug"] is True
    assert sys.modules["muster.debug"]  # the reporter and filter Django was told to use are importable
