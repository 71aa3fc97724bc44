"""The instances app's hand-written statements: the placement reads a plan, a submit and every
placement ask (a page of candidate hosts, a project's active fleets), as written SQL because the ORM
spent more building and compiling each than the database spent answering it.

Each read's meaning is its ORM form beside it (free_instances; the fleets: Fleet.objects.filter),
which tests/engine/test_candidate_reads.py holds the SQL to. Columns come from the models' `_meta`;
rows become objects through muster.rows.from_row.

And what each project holds of each fleet (`held`, `usage_by_project`): the hosts (and their GPUs)
its jobs hold, counted by their holder column, read by placement's quota check under the fleet's
lock, the console's fleets page and /metrics. And a
release counted on a fleet's admission row, read back by the same statement (`count_release`).
"""

from __future__ import annotations

import functools

from django.db import connection, transaction
from django.db.models import Count, F, Q, Sum

from instances.models import (
    Fleet,
    FleetQueue,
    FleetShare,
    FleetStatus,
    GroupKind,
    Instance,
    InstanceGroup,
    InstanceStatus,
)
from muster import rows
from projects.models import Project


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
    `backends` and called `names` when given, oldest first; then, in the same statement, the active
    fleets other projects share with this one (`Fleet.objects.filter(shares__project_id=...)`,
    called `owner/name` in `names`), by owner and name. Each fleet carries `shared` (whether it has
    shares at all: instances/shares.py asks no more of a fleet that has none) and, another
    project's, `shared_from` (its owner's name)."""
    f = functools.partial(_column, Fleet, alias="f")
    s = functools.partial(_column, FleetShare, alias="s")
    shares = f'"{FleetShare._meta.db_table}"'
    mine = f"{f('project')} = %s"
    shared_here = f"EXISTS (SELECT 1 FROM {shares} s WHERE {s('fleet')} = {f('id')} AND {s('project')} = %s)"
    where = [f"({mine} OR {shared_here})", f"{f('status')} = %s"]
    params: list = [project_id, project_id, FleetStatus.ACTIVE.value]
    if not_backend is not None:
        where.append(f"{f('backend')} <> %s")
        params.append(not_backend)
    bare = [name.split("/", 1)[-1] for name in names or []]
    for name, values in (("backend", backends), ("name", bare)):
        if values:
            where.append(f"{f(name)} IN ({', '.join(['%s'] * len(values))})")
            params.extend(values)
    owner = _column(Project, "name", "p")
    any_share = f"EXISTS (SELECT 1 FROM {shares} s WHERE {s('fleet')} = {f('id')})"
    sql = (f'SELECT {rows.column_list(Fleet, "f")}, {owner}, {any_share} FROM "{Fleet._meta.db_table}" f '
           f'JOIN "{Project._meta.db_table}" p ON {_column(Project, "id", "p")} = {f("project")} '
           f"WHERE {' AND '.join(where)} ORDER BY {f('project')} <> %s, "
           f"CASE WHEN {f('project')} = %s THEN {f('created')} END, {owner}, {f('name')}")
    found = []
    width = len(rows.columns(Fleet))
    for row in rows.fetch(sql, [*params, project_id, project_id]):
        fleet = rows.from_row(Fleet, row[:width])
        fleet.shared = bool(row[width + 1])
        if fleet.project_id != project_id:
            fleet.shared_from = row[width]
        written = f"{fleet.shared_from}/{fleet.name}" if fleet.project_id != project_id else fleet.name
        if not names or written in names:
            found.append(fleet)
    return found


def held(fleet_ids: list[int] | None = None) -> dict[tuple[int, int], tuple[int, int]]:
    """{(fleet id, project id): (hosts, GPUs)} that each project holds on each fleet (of `fleet_ids`
    only, when given): its hosts' count by holder (Instance.holder, written with the move that gives
    a host to a job and cleared by the one that makes it idle or ends it), read from the partial
    index instance_held alone: one table, however many jobs there are. A host is held from its
    placement to its job's end (a job that is terminating still holds it), and a host kept for a
    restart of the same project's group stays held; a host being deleted (instance status
    terminating) is nobody's."""
    if fleet_ids is not None and not fleet_ids:
        return {}
    hosts = Instance.objects.filter(holder__isnull=False)
    if fleet_ids:
        hosts = hosts.filter(fleet_id__in=fleet_ids)
    counted = hosts.values_list("fleet_id", "holder_id").annotate(n=Count("*"), gpus=Sum("gpu_count")).order_by()
    return {(fleet, project): (n, int(gpus or 0)) for fleet, project, n, gpus in counted if fleet is not None}


def usage_by_project(fleet: Fleet) -> dict[int, tuple[int, int]]:
    """{project id: (hosts, GPUs)} each project's jobs hold on `fleet`: what the console's
    fleet page shows per project (a fleet's quotas per project go beside it)."""
    return {project: used for (_, project), used in held([fleet.pk]).items()}


@functools.cache
def _count_release_sql() -> str:
    table = connection.ops.quote_name(FleetQueue._meta.db_table)
    pk, wanted, admitted = (connection.ops.quote_name(FleetQueue._meta.get_field(name).column)
                            for name in ("fleet", "wanted", "admitted"))
    return (f"UPDATE {table} SET {wanted} = {wanted} + 1 WHERE {pk} = ANY(%s) "
            f"RETURNING {pk}, {wanted}, {admitted}")


def count_release(fleet_ids: list[int]) -> dict[int, tuple[int, int]]:
    """One more release on each fleet's admission row that exists: {fleet id: (wanted, admitted)}
    as the increment left them, read by the same statement (so two releases at once each see their
    own count: exactly one of them sees the first release since the last look)."""
    if rows.one_statement(connection):
        with connection.cursor() as cursor:
            cursor.execute(_count_release_sql(), [list(fleet_ids)])
            return {pk: (wanted, admitted) for pk, wanted, admitted in cursor.fetchall()}
    # SQLite: the IMMEDIATE transaction keeps every other writer out between the two
    with transaction.atomic():
        FleetQueue.objects.filter(pk__in=fleet_ids).update(wanted=F("wanted") + 1)
        return {pk: (wanted, admitted) for pk, wanted, admitted in
                FleetQueue.objects.filter(pk__in=fleet_ids).values_list("pk", "wanted", "admitted")}
