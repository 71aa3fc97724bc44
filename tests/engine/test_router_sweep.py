"""sweep_routers (beat's safety net of the router sync, engine/router_sync.py) reads only the live
services: with 10,000 tasks waiting, parsing every live run's configuration took it 2 s a sweep
(bench.queueing)."""

from __future__ import annotations

import pytest

from engine import messages, router_sync
from runs.models import Run
from runs.services.submission import submit_run
from tests.engine.helpers import local_project_fleet
from tests.serving_pd.test_drain_waits_for_routers import PD

pytestmark = pytest.mark.django_db(transaction=True)



def test_the_sweep_parses_only_the_live_services(monkeypatch):
    fleet = local_project_fleet(size=2)
    service = submit_run(fleet.project, None, {"configuration": PD})
    tasks = [submit_run(fleet.project, None, {"configuration": f"type: task\nname: t{i}\ncommands: [echo]\n"})
             for i in range(3)]
    Run.objects.filter(pk__in=[service.pk, *(t.pk for t in tasks)]).update(status="running")
    parsed, sent = [], []
    real = router_sync.run_configuration
    monkeypatch.setattr(router_sync, "run_configuration", lambda run: parsed.append(run.pk) or real(run))
    monkeypatch.setattr(messages, "sync_routers", sent.append)
    assert router_sync.sweep_routers() == 1
    assert sent == [service.pk] and parsed == [service.pk], "no task's configuration read"
