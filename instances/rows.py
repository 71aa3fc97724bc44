"""The instances app's hand-written statements: the placement reads a plan, a submit and every
placement ask (a page of candidate hosts, a project's active fleets), as written SQL because the ORM
spent more building and compiling each than the database spent answering it.

Each read's meaning is its ORM form beside it (free_instances; the fleets: Fleet.objects.filter),
which tests/engine/test_candidate_reads.py holds the SQL to. Columns come from the models' `_meta`;
rows become objects through muster.rows.from_row.

And what each project holds of each fleet (`held`, `usage_by_project`): the hosts and GPUs of its
unfinished jobs, one aggregate query, read by the console's fleets page and /metrics.
"""

from __future__ import annotations

import functools

from django.db import connection
from django.db.models import Q

from instances.models import Fleet, FleetStatus, GroupKind, Instance, InstanceGroup, InstanceStatus
from muster import rows
from runs.choices import JOB_UNFINISHED
from runs.models import Job, Run


def free_instances(fleet: Fleet, busy_too: bool = False):
    """The fleet's idle, reachable hosts; with `busy_too`, its busy ones as well (the hosts a run
    waiting for a full fleet will get once their jobs end): what candidate_page reads, as the ORM says it."""
    # Instance.objects, not fleet.instances: the related manager would set `fleet` on every row
    # and, with .only(), fetch each row's deferred fleet_id in a query of its own.
    statuses = [InstanceStatus.IDLE, InstanceStatus.BUSY] if busy_too else [InstanceStatus.IDLE]
    return Instance.objects.filter(
        Q(group__isnull=True) | Q(group__kind=GroupKind.CLUSTER), fleet=fleet, status__in=statuses, unreachable=False
    )


# what placement uses of a candidate host
CANDIDATE = ("id", "name", "resources", "gpu_count", "internal_ip")


def _column(model, name: str, alias: str) -> str:
    return f'{alias}."{model._meta.get_field(name).column}"'


@functools.cache
def _candidates_sql(statuses: int, tpu: bool, gpu: bool, after: bool) -> str:
    """free_instances narrowed by the indexed columns, one page in placement order."""
    i = functools.partial(_column, Instance, alias="i")
    where = [f"({i('group')} IS NULL OR {_column(InstanceGroup, 'kind', 'g')} = %s)", f"{i('fleet')} = %s",
             f"{i('status')} IN ({', '.join(['%s'] * statuses)})", f"{i('unreachable')} = %s",
             f"{i('cpus')} >= %s", f"{i('memory_gb')} >= %s", f"{i('tpu')} <> %s" if tpu else f"{i('tpu')} = %s"]
    if gpu:
        where.append(f"{i('gpu_count')} >= %s")
    if after:  # keyset paging from the last row of the page before
        where.append(f"({i('gpu_count')} > %s OR ({i('gpu_count')} = %s AND {i('id')} > %s))")
    return (f"SELECT {rows.column_list(Instance, 'i', CANDIDATE)} FROM \"{Instance._meta.db_table}\" i "
            f'LEFT OUTER JOIN "{InstanceGroup._meta.db_table}" g ON {_column(InstanceGroup, "id", "g")} = {i("group")} '
            f"WHERE {' AND '.join(where)} ORDER BY {i('gpu_count')}, {i('id')} LIMIT %s")


def candidate_page(fleet_id: int, busy_too: bool, cpus: float, memory_gb: float, tpu: bool, gpus: int | None,
                   after: tuple[int, int] | None, page: int) -> list[Instance]:
    """One page of free_instances(fleet, busy_too) with at least `cpus`, `memory_gb` (and `gpus`
    GPUs), TPU hosts or not as `tpu` says, fewest GPUs first, after (gpu_count, id) `after`."""
    statuses = [InstanceStatus.IDLE.value, InstanceStatus.BUSY.value] if busy_too else [InstanceStatus.IDLE.value]
    params = [GroupKind.CLUSTER.value, fleet_id, *statuses, False, cpus, memory_gb, ""]
    if gpus is not None:
        params.append(gpus)
    if after is not None:
        params.extend([after[0], after[0], after[1]])
    sql = _candidates_sql(len(statuses), tpu, gpus is not None, after is not None)
    return rows.fetch_objects(Instance, sql, [*params, page], CANDIDATE)


def active_fleets(project_id: int, not_backend: str | None, backends: list[str] | None,
                  names: list[str] | None) -> list[Fleet]:
    """`Fleet.objects.filter(project_id=..., status=active)`, but of backend `not_backend`, of
    `backends` and called `names` when given, oldest first."""
    f = functools.partial(_column, Fleet, alias="f")
    where, params = [f"{f('project')} = %s", f"{f('status')} = %s"], [project_id, FleetStatus.ACTIVE.value]
    if not_backend is not None:
        where.append(f"{f('backend')} <> %s")
        params.append(not_backend)
    for name, values in (("backend", backends), ("name", names)):
        if values:
            where.append(f"{f(name)} IN ({', '.join(['%s'] * len(values))})")
            params.extend(values)
    sql = (f'SELECT {rows.column_list(Fleet, "f")} FROM "{Fleet._meta.db_table}" f WHERE {" AND ".join(where)} '
           f"ORDER BY {f('created')}, {f('name')}")
    return rows.fetch_objects(Fleet, sql, params)


@functools.cache
def _held_sql(statuses: int, fleets: int | None) -> str:
    j, r, i = (functools.partial(_column, model, alias=a) for model, a in ((Job, "j"), (Run, "r"), (Instance, "i")))
    fleet = f" AND {i('fleet')} IN ({', '.join(['%s'] * fleets)})" if fleets else ""
    # DISTINCT: a host counts once for its project however many unfinished jobs are on it
    return (f"SELECT h.fleet_id, h.project_id, COUNT(*), COALESCE(SUM(h.gpu_count), 0) FROM ("
            f"SELECT DISTINCT {i('id')}, {i('fleet')} AS fleet_id, {i('gpu_count')} AS gpu_count, "
            f"{r('project')} AS project_id FROM \"{Job._meta.db_table}\" j "
            f"JOIN \"{Run._meta.db_table}\" r ON {r('id')} = {j('run')} "
            f"JOIN \"{Instance._meta.db_table}\" i ON {i('id')} = {j('instance')} "
            f"WHERE {j('status')} IN ({', '.join(['%s'] * statuses)}){fleet}) h "
            "GROUP BY h.fleet_id, h.project_id")


def held(fleet_ids: list[int] | None = None) -> dict[tuple[int, int], tuple[int, int]]:
    """{(fleet id, project id): (hosts, GPUs)} that the project's unfinished jobs hold on each fleet
    (of `fleet_ids` only, when given): one aggregate query over the unfinished jobs (the jobs' status
    index), whatever the number of finished ones. A host is held from its placement to its job's end
    (terminating included: it is not free until the job has ended)."""
    if fleet_ids is not None and not fleet_ids:
        return {}
    statuses = [s.value for s in JOB_UNFINISHED]
    with connection.cursor() as cursor:
        cursor.execute(_held_sql(len(statuses), len(fleet_ids) if fleet_ids else None), [*statuses, *(fleet_ids or [])])
        return {(fleet, project): (hosts, int(gpus)) for fleet, project, hosts, gpus in cursor.fetchall()
                if fleet is not None}


def usage_by_project(fleet: Fleet) -> dict[int, tuple[int, int]]:
    """{project id: (hosts, GPUs)} each project's unfinished jobs hold on `fleet`: what the console's
    fleet page shows per project (a fleet's quotas per project go beside it)."""
    return {project: used for (_, project), used in held([fleet.pk]).items()}
