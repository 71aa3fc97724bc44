"""Helpers the scenarios share: a project with a user, task documents, counters, a table printer."""

from __future__ import annotations

import time

from bench import harness, instrument


def task_yaml(nodes: int, gpu: str | None = None, retry: bool = False) -> str:
    lines = ["type: task", f"nodes: {nodes}", "commands: [echo]"]
    if gpu:
        lines.append(f"resources: {{gpu: {gpu}}}")
    lines.append(f"retry: {'true' if retry else 'false'}")
    return "\n".join(lines) + "\n"


def project_with_user(name: str, superuser: bool = False):
    """`superuser`: the caller local fleets take runs from (projects.services.access.check_local_fleet),
    as the admin `muster serve` makes on a first start."""
    from django.contrib.auth import get_user_model

    from projects.models import Membership, Project, Role
    from projects.services.tokens import issue

    project = Project.objects.create(name=name)
    user, _ = get_user_model().objects.get_or_create(username="bench-admin" if superuser else "bench",
                                                     defaults={"is_superuser": superuser, "is_staff": superuser})
    Membership.objects.get_or_create(project=project, user=user, defaults={"role": Role.ADMIN})
    return project, user, issue(user)[1]


def submit_burst(project, user, doc: str, count: int) -> tuple[float, int]:
    """Submit `count` runs in this process through the product's submit path; (seconds, statements)."""
    from runs.services.submission import submit_run

    instrument.wrap_this_thread()
    q0 = instrument.local_count()
    t0 = time.perf_counter()
    for _ in range(count):
        submit_run(project, user, {"configuration": doc})
    return time.perf_counter() - t0, instrument.local_count() - q0


class Meter:
    """Worker CPU, counted statements and PostgreSQL transaction deltas over a window."""

    def __init__(self, session: harness.Session, worker_pids: list[int]):
        self.session, self.pids = session, worker_pids
        self.redis = session.redis()

    def start(self) -> None:
        instrument.reset(self.redis)
        self.cpu0 = harness.cpu_seconds(self.pids)
        self.pg0 = self.session.pg_stats()
        self.redis_cmds0 = self._redis_commands()
        self.driver_q0 = instrument.local_count()
        self.driver_x0 = instrument.local_xacts()

    def _redis_commands(self) -> int:
        try:
            return int(self.redis.info("stats")["total_commands_processed"])
        except Exception:  # noqa: BLE001
            return 0

    def stop(self, pg_settle: float = 11.0) -> dict:
        cpu = harness.cpu_seconds(self.pids) - self.cpu0
        stats = instrument.read(self.redis)
        redis_cmds = self._redis_commands() - self.redis_cmds0
        driver_q = instrument.local_count() - self.driver_q0
        driver_x = instrument.local_xacts() - self.driver_x0
        if pg_settle and not self.session.embedded:
            time.sleep(pg_settle)  # idle backends flush their statistics after 10 s (PostgreSQL 15)
        pg1 = self.session.pg_stats()
        pg = {k: pg1[k] - self.pg0[k] for k in pg1}
        # cross-check: every transaction counted anywhere (workers incl. the sweeps of the settle
        # wait, the driver) against PostgreSQL's own count for the database
        counted_all = sum(v["xacts"] for v in instrument.read(self.redis).values()) + driver_x
        return {"cpu_s": cpu, "tasks": stats, "redis_commands": redis_cmds, "driver_statements": driver_q,
                "driver_xacts": driver_x, "pg": pg, "counted_xacts_until_pg_read": counted_all}


def per_job(measure: dict, jobs: int) -> dict:
    tasks = measure["tasks"]
    total = sum(v["queries"] for v in tasks.values())
    sweep = tasks.get("engine.tasks.sweep", {}).get("queries", 0)
    out = {
        "statements_per_job": total / jobs,
        "statements_per_job_excl_sweep": (total - sweep) / jobs,
        "by_task_per_job": {k: round(v["queries"] / jobs, 2) for k, v in tasks.items()},
        "task_calls_per_job": {k: round(v["calls"] / jobs, 2) for k, v in tasks.items()},
        "cpu_s_per_job": measure["cpu_s"] / jobs,
        # server-wide count minus the bench's own counters (4 commands per task, bench/instrument.py)
        "redis_commands_per_job": (measure["redis_commands"] - 4 * sum(v["calls"] for v in tasks.values())) / jobs,
    }
    xacts = sum(v["xacts"] for v in tasks.values())
    out["xacts_per_job"] = xacts / jobs
    out["xacts_per_job_excl_sweep"] = (xacts - tasks.get("engine.tasks.sweep", {}).get("xacts", 0)) / jobs
    if measure["pg"]:
        pg = measure["pg"]
        out["pg_xacts_seen"] = pg["xact_commit"] + pg["xact_rollback"]
        out["counted_xacts"] = measure["counted_xacts_until_pg_read"]
        out["pg_tup_written_per_job"] = (pg["tup_inserted"] + pg["tup_updated"] + pg["tup_deleted"]) / jobs
    return out


def table(title: str, headers: list[str], rows: list[list]) -> str:
    cells = [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))
    out = [f"\n== {title}", line, "-" * len(line)]
    out += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    text = "\n".join(out)
    print(text, flush=True)
    return text


def _fmt(value) -> str:
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 1:
            return f"{value:.2f}"
        return f"{value:.4f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)
