"""Plan and apply do a fixed, small number of statements, whatever the number of nodes.

Statement counts are the stable figure of the submit path on a loaded machine (docs/performance.md,
"Submit"): these guard them. Counted through the REST API as the CLI calls it, token auth included,
for a member (not a superuser) on an SSH fleet's idle hosts, which the plan reads but never contacts.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from instances.models import Fleet, FleetBackend, Instance, InstanceStatus
from runs.models import Job, Run

pytestmark = pytest.mark.django_db

RUNS = "/api/projects/main/runs/"
TRANSACTION = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE SAVEPOINT")


def ssh_fleet(project, hosts: int) -> Fleet:
    fleet = Fleet.objects.create(project=project, name="hosts", backend=FleetBackend.SSH, placement="cluster",
                                 configuration={"type": "fleet", "name": "hosts", "nodes": hosts}, network="10.0.0.0/8")
    resources = {"cpus": 8, "memory_gb": 64.0, "disk_gb": 500.0, "cpu_arch": "x86", "gpus": [], "tpu": None}
    Instance.objects.bulk_create([
        Instance(project=project, fleet=fleet, name=f"hosts-{i}", status=InstanceStatus.IDLE, backend="ssh",
                 internal_ip=f"10.0.{i // 250}.{i % 250 + 1}", index=i, resources=resources,
                 **Instance.resource_columns(resources))
        for i in range(hosts)])
    return fleet


@pytest.fixture(autouse=True)
def _members_not_on_local_fleets(settings):
    # the production default (the suite opens local fleets to members): a member's apply then asks
    # which fleets its run may use, one statement
    settings.MUSTER = {**settings.MUSTER, "LOCAL_FLEET_MEMBERS": False}


def statements(queries) -> list[str]:
    return [q["sql"] for q in queries if not q["sql"].startswith(TRANSACTION)]


def reads_of(table: str, sqls: list[str]) -> int:
    return sum(1 for sql in sqls if sql.startswith("SELECT") and f'FROM "{table}"' in sql)


@pytest.mark.parametrize("nodes", [4, 64])
def test_a_plan_reads_the_fleets_once_and_the_idle_hosts_once(api, project, nodes):
    ssh_fleet(project, 100)
    doc = {"configuration": f"type: task\nnodes: {nodes}\ncommands: [echo]\n"}
    api.post(RUNS + "plan", doc, format="json")  # warm: the first request of a process loads more
    with CaptureQueriesContext(connection) as queries:
        answer = api.post(RUNS + "plan", doc, format="json")
    assert answer.status_code == 200, answer.content
    plan = answer.json()
    assert plan["capacity"]["fits"] and plan["capacity"]["fleet"] == "hosts"
    # the hosts it names are the ones the fit test read: every one idle, as many as the summary shows
    assert len(plan["capacity"]["hosts"]["default"]) == min(max(nodes, 8), 32)
    assert [j["job_num"] for j in plan["jobs"]] == list(range(nodes))
    sqls = statements(queries)
    # the token's user with the project and the caller's role in it (one read), the fleets, one page of idle hosts
    assert reads_of("instances_fleet", sqls) == 1, sqls
    assert reads_of("instances_instance", sqls) == 1, sqls
    assert len(sqls) == 3, sqls
    assert not Run.objects.exists()


@pytest.mark.parametrize("nodes", [4, 64])
def test_an_apply_inserts_the_run_its_jobs_and_its_event_once_each(api, project, nodes):
    ssh_fleet(project, 100)
    doc = {"configuration": f"type: task\nnodes: {nodes}\ncommands: [echo]\n"}
    api.post(RUNS + "plan", doc, format="json")
    with CaptureQueriesContext(connection) as queries:
        answer = api.post(RUNS, doc, format="json")
    assert answer.status_code == 201, answer.content
    assert [j["job_num"] for j in answer.json()["jobs"]] == list(range(nodes))
    sqls = statements(queries)
    writes = [sql for sql in sqls if not sql.startswith("SELECT")]
    if connection.vendor == "postgresql":
        # the three as one statement, with no transaction around it (runs/rows.py)
        assert len(writes) == 1 and writes[0].startswith('WITH r AS (INSERT INTO "runs_run"'), writes
        assert [t for t in ("runs_job", "events_event") if f'INSERT INTO "{t}"' in writes[0]] == ["runs_job", "events_event"]
    else:
        # SQLite takes at most 999 parameters a statement: 64 job rows are two INSERTs there
        tables = [sql.split('"')[1] for sql in writes]
        assert [t for i, t in enumerate(tables) if i == 0 or t != tables[i - 1]] == [
            "runs_run", "runs_job", "events_event"], sqls
    # plus the token's user with the project (one read), the fleets a member's run may use (local ones or
    # not), and the project's runs not finished, counted up to its cap (runs/limits.py)
    assert len(sqls) == 3 + len(writes), sqls
    assert Job.objects.filter(run__name=answer.json()["name"]).count() == nodes
