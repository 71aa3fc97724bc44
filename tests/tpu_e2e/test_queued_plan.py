"""What is said before a slice is asked for from a fleet of queued resources, through the `muster`
CLI against a live server. A flex-start fleet's bound: the fleet's apply says how long after it is
made each slice is reclaimed, and the plan of a run that would go there says it for the run's group
(`muster ps` shows the deadline itself once Google gives the slice: test_flex_start.py). A
replace-slice set on a queued fleet: the plan warns, naming the key, that the set goes whole there.
Nothing is created: no worker, no hosts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import example, token_for
from tests.tpu_e2e.helpers import tpu_task

pytestmark = pytest.mark.django_db(transaction=True)

MUSTER = [sys.executable, "-c", "import sys; from cli.main import main; sys.exit(main())"]


@pytest.fixture
def muster(live_server, make_user, tmp_path, settings, fake_tpu):
    settings.MUSTER = {**settings.MUSTER, "GCP": {"project_id": "test-project", "api_endpoint": fake_tpu.endpoint,
                                                  "zones": ["settings-zone"], "timeout": 5}}
    env = {**os.environ, "HOME": str(tmp_path), "MUSTER_URL": live_server.url,
           "MUSTER_TOKEN": token_for(make_user("bob")), "MUSTER_PROJECT": "main"}

    def run(*args: str) -> str:
        done = subprocess.run([*MUSTER, *args], env=env, capture_output=True, text=True, timeout=300,
                              cwd=Path(__file__).resolve().parents[2], stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    return run


def write(tmp_path: Path, name: str, conf: dict) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(conf))
    return str(path)


@pytest.mark.parametrize(("duration", "said"), [("2d", "2d"), ("90m", "1h30m")])
def test_a_flex_start_fleet_and_the_plan_of_a_run_on_it_say_when_the_slice_is_reclaimed(
        muster, tmp_path, duration, said):
    fleet = {**yaml.safe_load(example("tpu-fleet.yml")),
             "queued_resource": {"provisioning_model": "flex-start", "max_run_duration": duration}}

    applied = muster("apply", "-f", write(tmp_path, "fleet.yml", fleet))
    plan = muster("plan", "-f", write(tmp_path, "task.yml", tpu_task("flex-plan", "v4-8")))

    assert f"flex-start: the slice is reclaimed at most {said} after it is made" in applied, applied
    assert "Fits fleet tpu now." in plan, plan
    assert (f"(fleet tpu, flex-start): the slice is reclaimed at most {said} after it is made "
            "(queued_resource.max_run_duration)") in plan, plan


def test_a_fleet_without_flex_start_says_no_deadline(muster, tmp_path):
    applied = muster("apply", "-f", write(tmp_path, "fleet.yml", yaml.safe_load(example("tpu-fleet.yml"))))
    plan = muster("plan", "-f", write(tmp_path, "task.yml", tpu_task("plain-plan", "v4-8")))

    assert "Fits fleet tpu now." in plan, plan
    assert "reclaimed" not in applied and "Deadline" not in plan, (applied, plan)


REPLACE_SET = {"type": "task", "name": "ms-plan", "slices": 2, "resources": {"gpu": "tpu-v4-16"},
               "on_slice_failure": "replace-slice", "commands": ["echo"]}


@pytest.mark.parametrize(("queued", "warned"), [({"valid_until": "2h"}, True), (None, False)],
                         ids=["queued-fleet", "direct-fleet"])
def test_the_plan_of_a_replace_slice_set_says_when_its_fleet_makes_sets_whole(muster, api, tmp_path, queued,
                                                                              warned):
    fleet = {**yaml.safe_load(example("tpu-fleet.yml")), **({"queued_resource": queued} if queued else {})}
    muster("apply", "-f", write(tmp_path, "fleet.yml", fleet))

    plan = muster("plan", "-f", write(tmp_path, "task.yml", REPLACE_SET))
    groups = {"type": "task", "name": "ms-groups", "groups": [
        {"name": "eval", "resources": {"gpu": "tpu-v4-8"}, "commands": ["echo"]},
        {"name": "train", **{k: REPLACE_SET[k] for k in ("slices", "resources", "on_slice_failure", "commands")}}]}
    grouped = muster("plan", "-f", write(tmp_path, "groups.yml", groups))
    answer = api.post("/api/projects/main/runs/plan", {"configuration": groups}, format="json").json()

    said = ("on_slice_failure: replace-slice applies to fleets that create slices directly: fleet tpu asks Google "
            "for one queued resource per set, which Google fills and deletes whole, so a lost slice ends the whole "
            "set there (as whole-set)")
    assert "Fits fleet tpu now." in plan and "Fits fleet tpu now." in grouped, (plan, grouped)
    assert (said in plan, said in grouped) == (warned, warned), (plan, grouped)
    assert grouped.count("on_slice_failure") == (1 if warned else 0), "the replace-slice group only"
    assert [w["field"] for w in answer["warnings"]] == ([["groups", 1, "on_slice_failure"]] if warned else [])
