"""A fleet shared between projects as each project sees it beyond the API's fleet list
(docs/queueing.md, "What each project sees"): the queue filtered by `owner/name`, the console's
fleets page (the fleets shared with the project, and on the owner's page each project's usage
against its quota) and /metrics (each project's quota beside its usage). Both projects have a run
called `train` waiting for the fleet: each page and queue shows its own project's only.

What the workers would leave is written directly (runs submitted through the API, their jobs
placed or waiting as the engine writes them): nothing here runs a job."""

from __future__ import annotations

import html
import re

import pytest

from tests.conftest import client_for
from tests.console.test_metrics import scrape, value
from tests.console.test_pages import _browser, _submit, _user

pytestmark = pytest.mark.django_db

RUN = "type: task\nname: {name}\ncommands: [echo]\nretry: {{on_events: [no-capacity], duration: 1h}}\n"


@pytest.fixture
def shared(make_user):
    """alpha's `pool` (4 hosts) shared with beta (alpha 2 hosts, beta 2 hosts and 8 GPUs); gamma's
    `pool` shared with nobody but alpha; beta's own `mine`. Each of alpha and beta holds one host of
    `pool` and has a run `train` waiting for it; beta's `beta-only` waits for `mine`."""
    from instances.models import Fleet, FleetShare, Instance
    from projects.models import Project
    from runs.choices import JobStatus
    from runs.models import Job, Run

    users = {name: _user(make_user, f"u-{name}", name) for name in ("alpha", "beta", "gamma")}
    alpha, beta, gamma = (Project.objects.get(name=n) for n in ("alpha", "beta", "gamma"))
    pool = Fleet.objects.create(project=alpha, name="pool", backend="ssh", placement="cluster", configuration={})
    mine = Fleet.objects.create(project=beta, name="mine", backend="ssh", configuration={})
    gammas = Fleet.objects.create(project=gamma, name="pool", backend="ssh", configuration={})
    Fleet.objects.create(project=gamma, name="old", backend="ssh", configuration={}, status="terminating")
    FleetShare.objects.create(fleet=pool, project=alpha, hosts=2)
    FleetShare.objects.create(fleet=pool, project=beta, hosts=2, gpus=8, borrow_hosts=1)
    FleetShare.objects.create(fleet=gammas, project=alpha, hosts=1)
    hosts = [Instance.objects.create(project=alpha, fleet=pool, name=f"pool-{i}", index=i, status="busy",
                                     backend="ssh", resources={"gpus": [{"name": "A100", "memory_gb": 80}] * 2})
             for i in range(4)]
    for project, holder, host in (("alpha", "secret-alpha", hosts[0]), ("beta", "secret-beta", hosts[1])):
        _submit(users[project], RUN.format(name=holder), project=project)
        Job.objects.filter(run__project__name=project, run__name=holder).update(status=JobStatus.RUNNING,
                                                                                instance=host)
        Instance.objects.filter(pk=host.pk).update(holder=Project.objects.get(name=project))
    for project, name, fleet in (("alpha", "train", pool), ("beta", "train", pool), ("beta", "beta-only", mine)):
        _submit(users[project], RUN.format(name=name), project=project)
        Job.objects.filter(run__project__name=project, run__name=name).update(
            waiting_for=f"a free host: fleet {fleet.name} is full", waiting_fleet=fleet)
        Run.objects.filter(project__name=project, name=name).update(status="submitted")
    return users


def _runs(answer) -> list[tuple]:
    assert answer.status_code == 200, answer.content
    return [(r["project"], r["run"], r["position"]) for r in answer.json()["runs"]]


def test_the_queue_of_a_fleet_shared_with_the_project_by_owner_name(shared):
    beta, alpha = client_for(shared["beta"]), client_for(shared["alpha"])
    assert _runs(beta.get("/api/projects/beta/queue/?fleet=alpha/pool")) == [("beta", "train", 1)]
    assert _runs(beta.get("/api/projects/beta/queue/?fleet=mine")) == [("beta", "beta-only", 2)]
    assert _runs(alpha.get("/api/projects/alpha/queue/?fleet=pool")) == [("alpha", "train", 1)]
    assert _runs(alpha.get("/api/projects/alpha/queue/?fleet=gamma/pool")) == []  # shared with alpha: no run waits
    assert "_fleet_id" not in beta.get("/api/projects/beta/queue/").json()["runs"][0]
    # a fleet not shared with beta, or its bare name, is an unknown fleet: the same 400
    for name in ("gamma/pool", "pool", "nosuch", "alpha/nosuch"):
        answer = beta.get(f"/api/projects/beta/queue/?fleet={name}")
        assert answer.status_code == 400, (name, answer.content)
        (error,) = answer.json()["errors"]
        assert error["loc"] == ["fleet"]
        assert error["msg"] == f"project beta has no fleet {name!r}: its fleets are alpha/pool, mine", error


def _section(page: str, label: str) -> str:
    found = re.search(rf'<section class="[^"]*" aria-label="fleet {re.escape(label)}">(.*?)</section>', page, re.S)
    assert found, f"no section for fleet {label}"
    return found.group(1)


def _rows(section: str, kind: str) -> list[list[str]]:
    table = re.search(rf'<table class="{kind}">(.*?)</table>', section, re.S)
    if table is None:
        return []
    body = table.group(1).split("<tbody>")[1]
    return [[html.unescape(re.sub(r"<[^>]+>", "", cell)).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
            for row in body.split("<tr")[1:]]


def test_the_fleets_page_lists_the_fleets_shared_with_the_project_and_the_owner_sees_each_quota(shared):
    page = _browser(shared["beta"]).get("/projects/beta/fleets/").content.decode()
    borrowed = _section(page, "alpha/pool")
    assert "shared by alpha" in borrowed and "4 live hosts" in borrowed
    assert _rows(borrowed, "usage") == [["beta", "1 of 4", "2", "2 hosts, 8 GPUs"]]  # its own share only
    assert [row[:4] for row in _rows(borrowed, "queue")] == [["1", "train", "0", "0"]]
    assert _rows(borrowed, "hosts") == []  # the owner's hosts and the jobs on them are not listed
    assert [row[:2] for row in _rows(_section(page, "mine"), "queue")] == [["2", "beta-only"]]
    assert page.count('data-run="train"') == 1  # alpha's `train` waits for the same fleet: not shown
    assert "secret-alpha" not in page and "gamma/pool" not in page

    page = _browser(shared["alpha"]).get("/projects/alpha/fleets/").content.decode()
    own = _section(page, "pool")
    assert _rows(own, "usage") == [["alpha", "1 of 4", "2", "2 hosts"], ["beta", "1 of 4", "2", "2 hosts, 8 GPUs"]]
    assert [row[:2] for row in _rows(own, "queue")] == [["1", "train"]]
    assert page.count('data-run="train"') == 1
    assert "secret-beta" not in page and "beta-only" not in page
    hosts = {row[1]: row[-1] for row in _rows(own, "hosts")}  # beta's job on alpha's host is not named
    assert hosts == {"pool-0": "secret-alpha/default/0", "pool-1": "another project's job", "pool-2": "-",
                     "pool-3": "-"}
    assert "shared by gamma" in _section(page, "gamma/pool")


def test_metrics_give_each_project_s_quota_per_shared_fleet_and_usage_of_active_fleets_only(shared, client, settings):
    settings.MUSTER = {**settings.MUSTER, "METRICS_TOKEN": "scrape-token"}
    samples = scrape(client)
    assert value(samples, "muster_fleet_quota_hosts", project="alpha", fleet="alpha/pool") == 2
    assert value(samples, "muster_fleet_quota_hosts", project="beta", fleet="alpha/pool") == 2
    assert value(samples, "muster_fleet_quota_gpus", project="beta", fleet="alpha/pool") == 8
    assert ("muster_fleet_quota_gpus", (("fleet", "alpha/pool"), ("project", "alpha"))) not in samples  # no quota
    assert value(samples, "muster_fleet_hosts_held", project="beta", fleet="alpha/pool") == 1
    assert value(samples, "muster_fleet_gpus_held", project="alpha", fleet="alpha/pool") == 2
    # the project a fleet is shared with has its series from the start, at 0 while it holds nothing
    assert samples[("muster_fleet_hosts_held", (("fleet", "gamma/pool"), ("project", "alpha")))] == 0
    quotas = {dict(labels)["fleet"] for (name, labels) in samples if name == "muster_fleet_quota_hosts"}
    assert quotas == {"alpha/pool", "gamma/pool"}  # only shared fleets have quotas
    held = {dict(labels)["fleet"] for (name, labels) in samples if name == "muster_fleet_hosts_held"}
    assert held == {"alpha/pool", "beta/mine", "gamma/pool"}  # gamma's terminating `old`: no series
