"""The batch steps survive a duplicated message and a lost one, with a real worker: advance_jobs (the
starts one placement step asks for together: a gang), finish_jobs (the ends one step asks for
together: a run's teardown, a watch batch) and process_runs (the runs of the jobs one finish_jobs
ended). A lost one is the sweep's to send again, as single messages."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from engine import tasks
from instances.models import Instance
from runs.models import Job, Run
from runs.services import logs
from runs.services.submission import submit_run
from runs.transitions import request_stop
from tests.engine.faults import inject
from tests.engine.helpers import Beat, job_summary, local_project_fleet, wait_for_run
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

LONG = """
type: task
name: {name}
nodes: {nodes}
commands:
  - echo "started rank $DSTACK_NODE_RANK"
  - sleep 120
"""


SHORT = """
type: task
name: {name}
nodes: 2
commands:
  - echo "started rank $DSTACK_NODE_RANK"
  - sleep 0.5
"""


@pytest.mark.parametrize("mode", ["twice", "drop"])
def test_a_gang_starts_once_when_its_advance_jobs_message_is_duplicated_or_lost(
        mode, fast_limits, celery_worker, monkeypatch):
    from engine.starting import advance

    fleet = local_project_fleet(size=2)
    faulty = inject(monkeypatch, "advance_jobs", mode)
    real, held = advance.advance_jobs, []
    monkeypatch.setattr(advance, "advance_jobs", lambda job_ids: held.append(real(job_ids)) or held[-1])
    with Beat(interval=0.3):
        run = submit_run(fleet.project, None, {"configuration": SHORT.format(name=f"gang-{mode}")})
        run = wait_for_run(run.name, timeout=60)
    assert run.status == "done", job_summary(run)
    assert faulty.injected >= 1, "job 0 placed its gang and both starts went as one advance_jobs message"
    if mode == "twice":  # (a dropped one is never taken: the sweep starts the jobs, one message each)
        assert 2 in {len(h) for h in held}, "a delivery advanced both jobs in one step"
    for job in run.current_jobs():
        assert logs.read(job).decode().count("started rank") == 1, "each job's commands ran exactly once"
    assert not Instance.objects.filter(status="busy").exists()


@pytest.mark.parametrize("mode", ["twice", "drop"])
def test_a_stopped_run_s_jobs_end_when_their_finish_jobs_message_is_duplicated_or_lost(
        mode, fast_limits, celery_worker, monkeypatch):
    fleet = local_project_fleet(size=2)
    faulty = inject(monkeypatch, "finish_jobs", mode)
    with Beat(interval=0.3):
        run = submit_run(fleet.project, None, {"configuration": LONG.format(name=f"stop-{mode}", nodes=2)})
        wait_until(lambda: Job.objects.filter(run=run, status="running").count() == 2, timeout=60,
                   what="both jobs running")
        request_stop(Run.objects.get(pk=run.pk))  # its teardown ends both jobs in one step
        run = wait_for_run(run.name, timeout=60)
    assert run.status == "terminated", job_summary(run)
    assert faulty.injected >= 1, "the teardown's two ends went as one finish_jobs message, and the fault was real"
    assert set(run.current_jobs().values_list("status", flat=True)) == {"terminated"}
    assert not Instance.objects.filter(status="busy").exists(), "both hosts handed back, each once"


@pytest.mark.parametrize("mode", ["twice", "drop"])
def test_runs_end_when_their_process_runs_message_is_duplicated_or_lost(
        mode, fast_limits, celery_worker, monkeypatch):
    fleet = local_project_fleet(size=2)
    faulty = inject(monkeypatch, "process_runs", mode)
    # the runs' jobs are put on the hosts here, ended by their runners as a watch batch leaves
    # them: their own placement messages are not sent
    monkeypatch.setattr(tasks.provision_job, "apply_async", lambda *args, **kwargs: None)
    runs = [submit_run(fleet.project, None, {"configuration": LONG.format(name=f"runs-{mode}-{i}", nodes=1)})
            for i in range(2)]
    hosts = list(fleet.instances.order_by("index"))
    for run, host in zip(runs, hosts, strict=True):
        Run.objects.filter(pk=run.pk).update(status="running", fleet=fleet)
        Instance.objects.filter(pk=host.pk).update(status="busy", holder=fleet.project)
        # changed "in a minute": the sweep would otherwise finish them itself, one message each,
        # if the worker were slow to take the test's finish_jobs
        Job.objects.filter(run=run).update(status="terminating", termination_reason="done_by_runner",
                                           instance=host, status_changed_at=timezone.now() + timedelta(minutes=1))
    jobs = list(Job.objects.filter(run__in=runs).order_by("pk"))
    with Beat(interval=0.3):
        tasks.finish_jobs.delay([j.pk for j in jobs])  # ends both, and asks for both runs in one message
        ended = [wait_for_run(run.name, timeout=60) for run in runs]
    assert [r.status for r in ended] == ["done", "done"], [job_summary(r) for r in ended]
    assert faulty.injected >= 1, "the two runs were asked for in one process_runs message, and the fault was real"
    assert not Instance.objects.filter(status="busy").exists()
