"""retry.duration counts as dstack counts it: from submission for no-capacity (tests/engine/
test_failures.py), from the last failure for error and interruption."""

from __future__ import annotations

import pytest

from runs.models import Job
from tests.engine.helpers import Beat, wait_for_run
from tests.waiting import job_states

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_an_error_is_retried_however_old_the_run_is_when_the_retry_starts_inside_the_duration(
        superuser_api, fast_limits, celery_worker, tmp_path):
    from tests.engine.helpers import local_project_fleet

    local_project_fleet(size=1)
    marks = tmp_path / "attempts"
    marks.mkdir()
    # each attempt outlives the duration (4s) counted from submission; the backoff (1s) fits in it
    conf = f"""
type: task
name: late-errors
nodes: 1
retry: {{on_events: [error], duration: 4s}}
commands:
  - sleep 5
  - n=$(ls {marks} | wc -l); touch {marks}/$n; [ "$n" -ge 2 ]
"""
    with Beat():  # the sweep resubmits a pending run once its backoff is over
        answer = superuser_api.post("/api/projects/main/runs/", {"configuration": conf}, format="json")
        assert answer.status_code == 201, answer.json()
        run = wait_for_run("late-errors", timeout=120)
    assert run.status == "done", job_states(run)
    assert list(Job.objects.filter(run=run).values_list("submission_num", "status")) == [
        (0, "failed"), (1, "failed"), (2, "done")]
