"""Shared fleets through the REST API (and the CLI), with a real worker on real sshd hosts in
network namespaces (docs/queueing.md, "Shared fleets"): project alpha owns fleet `pool` of 4 hosts
and shares it with project beta; each project's quota holds its runs, borrowing lets one use what the
other leaves idle, freed hosts go to the project furthest below its share, and neither project ever
sees the other's runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from events.models import Event
from instances.models import FleetShare, Instance
from runs.models import Run
from tests.conftest import client_for, token_for
from tests.engine.helpers import wait_for_run
from tests.ssh_e2e.helpers import Beat, fleet_configuration, needs_netns, netns_pool
from tests.waiting import patient, wait_until

pytestmark = [*needs_netns, pytest.mark.django_db(transaction=True), pytest.mark.slow]

pool = netns_pool(4)

HOLD = "type: task\nname: {name}\nfleets: [{fleet}]\ncommands: [sleep 600]\n" \
       "retry: {{on_events: [no-capacity], duration: 30m}}\n"


@pytest.fixture
def projects(make_user, celery_worker, settings):
    # the sweep's recheck is the backstop for a lost wake; out of the way here unless a test wants it
    settings.MUSTER = {**settings.MUSTER, "SSH_TIMEOUT": 5, "SSH_REGISTER_TIMEOUT": 60, "WAITING_HOST_RECHECK": 600}
    alice, bob = make_user("alice", project="alpha"), make_user("bob", project="beta")
    with Beat():
        yield {"alpha": client_for(alice), "beta": client_for(bob), "bob": bob}


def _share(pool, **keys) -> dict:
    return {**fleet_configuration(pool, name="pool"), **keys}


def _register(api, conf: dict) -> dict:
    answer = api.post("/api/projects/alpha/fleets/", {"configuration": conf}, format="json")
    assert answer.status_code == 202, answer.content

    def active():
        fleet = api.get("/api/projects/alpha/fleets/pool/").json()
        return fleet if fleet["status"] != "pending" else None

    fleet = wait_until(active, timeout=120, what="fleet pool to register")
    assert fleet["status"] == "active", fleet
    return fleet


def _submit(api, project: str, name: str, fleet: str) -> None:
    answer = api.post(f"/api/projects/{project}/runs/", {"configuration": HOLD.format(name=name, fleet=fleet)},
                      format="json")
    assert answer.status_code == 201, answer.content


def _stop(api, project: str, *names: str) -> None:
    for name in names:
        api.post(f"/api/projects/{project}/runs/{name}/stop", {}, format="json")
    for name in names:
        wait_for_run(name, statuses=("terminated", "done", "failed"), timeout=120, project=project)


def _waiting_for(api, project: str, name: str, starts: str) -> str:
    def said():
        text = api.get(f"/api/projects/{project}/runs/{name}/").json()["waiting_for"]
        return text if text.startswith(starts) else None
    return wait_until(said, timeout=90, what=f"{project}/{name} to wait for {starts!r}")


def _placed(project: str, name: str) -> bool:
    run = Run.objects.get(project__name=project, name=name)
    return run.jobs.filter(superseded=False, instance__isnull=False).exists()


def test_a_project_past_its_quota_waits_on_quota_while_the_others_hosts_are_idle_until_it_may_borrow(
        projects, pool):
    alpha, beta = projects["alpha"], projects["beta"]
    _register(alpha, _share(pool, shared_with=[{"project": "beta", "quota": {"hosts": 2}}]))
    assert sorted(FleetShare.objects.values_list("project__name", "hosts", "borrow_hosts")) == \
        [("alpha", 2, None), ("beta", 2, None)]  # the owner's quota: what beta is not given
    for name in ("b1", "b2", "b3"):
        _submit(beta, "beta", name, "alpha/pool")
    for name in ("b1", "b2"):
        wait_for_run(name, statuses=("running",), timeout=120, project="beta")
    said = _waiting_for(beta, "beta", "b3", "a free host: quota:")
    assert "quota: project beta holds 2 of its 2 hosts of fleet pool (borrowing: none)" in said, said
    assert Instance.objects.filter(fleet__name="pool", status="idle").count() == 2, "alpha's two hosts stay idle"
    queue = beta.get("/api/projects/beta/queue/").json()["runs"]
    assert [(r["run"], r["reason"][:6]) for r in queue] == [("b3", "quota:")], queue
    assert beta.get("/api/projects/beta/queue/?fleet=alpha/pool").json()["runs"] == queue  # `owner/name`

    # a re-apply that changes only the shares updates them in place, and the runs waiting for the
    # fleet look again at once (the sweep's recheck is 10 minutes away here): b3 borrows an idle host
    conf = _share(pool, shared_with=[{"project": "beta", "quota": {"hosts": 2}, "borrowing_limit": {"hosts": 1}}])
    again = alpha.post("/api/projects/alpha/fleets/", {"configuration": conf}, format="json")
    assert again.status_code == 201, again.content
    assert FleetShare.objects.get(project__name="beta").borrow_hosts == 1
    assert Event.objects.filter(subject="fleet pool", message__startswith="shares updated: shared_with").exists()
    wait_for_run("b3", statuses=("running",), timeout=120, project="beta")
    assert Instance.objects.filter(fleet__name="pool", status="idle").count() == 1
    # borrowing stops at its limit: a fourth run waits on the quota though a host is idle
    _submit(beta, "beta", "b4", "alpha/pool")
    said = _waiting_for(beta, "beta", "b4", "a free host: quota:")
    assert "holds 3 of its 2 hosts" in said and "borrowing: up to 1" in said, said
    # a change that is not only the shares is refused as before
    other = {**conf, "placement": "any"}
    assert alpha.post("/api/projects/alpha/fleets/", {"configuration": other}, format="json").status_code == 400
    _stop(beta, "beta", "b1", "b2", "b3", "b4")


def test_freed_hosts_go_to_the_project_furthest_below_its_share(projects, pool):
    alpha, beta = projects["alpha"], projects["beta"]
    _register(alpha, _share(pool, quota={"hosts": 2}, borrowing_limit={"hosts": 2},
                            shared_with=[{"project": "beta", "quota": {"hosts": 2}, "borrowing_limit": {"hosts": 2}}]))
    holders = [f"a{i}" for i in range(1, 5)]
    for name in holders:  # alpha borrows beta's idle quota: all 4 hosts
        _submit(alpha, "alpha", name, "pool")
    for name in holders:
        wait_for_run(name, statuses=("running",), timeout=120, project="alpha")
    _submit(alpha, "alpha", "a5", "pool")
    assert "quota: project alpha holds 4 of its 2 hosts" in _waiting_for(alpha, "alpha", "a5", "a free host: quota:")
    for name in ("b1", "b2"):
        _submit(beta, "beta", name, "alpha/pool")
        _waiting_for(beta, "beta", name, "a free host: fleet pool is full")

    # alpha holds 4 of 2 (share 2.0), beta 0 of 2: alpha's freed hosts go to beta until it is level
    _stop(alpha, "alpha", "a1")
    wait_for_run("b1", statuses=("running",), timeout=120, project="beta")
    assert not _placed("alpha", "a5") and not _placed("beta", "b2")
    _stop(alpha, "alpha", "a2")  # alpha 2 of 2 (1.0), beta 1 of 2 (0.5): beta again
    wait_for_run("b2", statuses=("running",), timeout=120, project="beta")
    assert not _placed("alpha", "a5")
    _stop(alpha, "alpha", "a3")  # alpha 1 of 2 (0.5), beta 2 of 2 (1.0): now alpha's turn
    wait_for_run("a5", statuses=("running",), timeout=120, project="alpha")
    _stop(alpha, "alpha", "a4", "a5")
    _stop(beta, "beta", "b1", "b2")


MUSTER = [sys.executable, "-c", "import sys; from cli.main import main; sys.exit(main())"]


def test_on_a_shared_fleet_neither_project_sees_the_others_runs(projects, pool, live_server, tmp_path):
    alpha, beta = projects["alpha"], projects["beta"]
    _register(alpha, _share(pool, shared_with=[{"project": "beta", "quota": {"hosts": 2}}]))
    # the same run names in both projects, and names that say whose they are
    for project, api, fleet in (("alpha", alpha, "pool"), ("beta", beta, "alpha/pool")):
        _submit(api, project, "same", fleet)
        _submit(api, project, f"secret-{project}", fleet)
    for project in ("alpha", "beta"):
        for name in ("same", f"secret-{project}"):
            wait_for_run(name, statuses=("running",), timeout=120, project=project)

    seen = {}
    for project, api in (("alpha", alpha), ("beta", beta)):
        other = "beta" if project == "alpha" else "alpha"
        answers = {path: api.get(f"/api/projects/{project}/{path}").json()
                   for path in ("runs/", "fleets/", "instances/", "queue/", "events/")}
        text = json.dumps(answers)
        assert f"secret-{other}" not in text, f"{project} sees a run of {other}"
        seen[project] = answers
        # the other project's jobs on the hosts are named only as that
        jobs = sorted(i["job"] or "" for i in answers["instances/"]) if answers["instances/"] else []
        if project == "alpha":
            assert jobs == ["another project's job", "another project's job", "same/0", "secret-alpha/0"], jobs
    shared = [f for f in seen["beta"]["fleets/"] if f.get("shared_from")]
    assert [(f["name"], f["shared_from"]) for f in shared] == [("alpha/pool", "alpha")], seen["beta"]["fleets/"]
    assert shared[0]["shares"] == [{"project": "beta", "quota": {"hosts": 2, "gpus": None},
                                    "borrowing_limit": {"hosts": None, "gpus": None}, "usage": {"hosts": 2, "gpus": 0}}]
    assert sorted(i["status"] for i in shared[0]["instances"]) == ["busy"] * 4
    assert "configuration" not in shared[0], "the owner's hosts' configuration is not shown to a project it shares with"
    owner = next(f for f in seen["alpha"]["fleets/"] if f["name"] == "pool")
    assert [(s["project"], s["usage"]["hosts"]) for s in owner["shares"]] == [("alpha", 2), ("beta", 2)]

    # beta cannot delete alpha's fleet: as an unknown fleet in beta
    assert beta.delete("/api/projects/beta/fleets/pool/").status_code == 404
    assert beta.get("/api/projects/beta/fleets/alpha%2Fpool/").status_code == 404
    # nor name a fleet of alpha that is not shared with it
    answer = beta.post("/api/projects/beta/runs/plan", {"configuration": HOLD.format(name="x", fleet="alpha/nope")},
                       format="json")
    assert answer.status_code == 200 and not answer.json()["capacity"]["fits"], answer.content

    # the CLI as bob: the shared fleet listed with beta's share
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "MUSTER_URL": live_server.url, "MUSTER_TOKEN": token_for(projects["bob"]),
           "MUSTER_PROJECT": "beta"}
    listed = subprocess.run([*MUSTER, "fleet", "list"], env=env, capture_output=True, text=True, timeout=patient(60),
                            cwd=Path(__file__).resolve().parents[2], stdin=subprocess.DEVNULL)
    assert listed.returncode == 0, listed.stderr
    assert "alpha/pool" in listed.stdout and "from alpha: beta 2/2 hosts" in listed.stdout, listed.stdout
    ps = subprocess.run([*MUSTER, "ps"], env=env, capture_output=True, text=True, timeout=patient(60),
                        cwd=Path(__file__).resolve().parents[2], stdin=subprocess.DEVNULL)
    assert "secret-beta" in ps.stdout and "secret-alpha" not in ps.stdout, ps.stdout
    _stop(alpha, "alpha", "same", "secret-alpha")
    _stop(beta, "beta", "same", "secret-beta")
