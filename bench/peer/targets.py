"""The two systems under test, each with the workloads' targets and the reads that tell when a
workload is over: Muster's through its database (the bench harness's), dstack's through its SQLite
file, read-only, so neither side's API is polled while it works."""

from __future__ import annotations

import sqlite3
import time

from bench import harness
from bench.peer import dstack_api as dstack
from bench.peer import dstack_seed
from bench.peer.workloads import Target


class Muster:
    name = "muster"

    def __init__(self, session: harness.Session, worker_nice: int | None = None):
        self.session, self.worker_nice = session, worker_nice

    def start(self) -> None:
        _, self.port = self.session.start_web()
        # None: the priority of dstack's server, whose scheduler runs in the process that serves the API
        self.session.start_worker("worker0", 4, nice=self.worker_nice)
        self.session.start_beat()

    def _target(self, label: str, doc: str, hosts: int) -> Target:
        from bench.hollow import make_hollow_fleet
        from bench.scenarios.common import project_with_user

        project, _, token = project_with_user(f"peer-{label}-{int(time.time() * 1000)}")
        if hosts:
            make_hollow_fleet(project, "hollow", hosts)
        self.project = project
        body = {"configuration": doc, "env": {}}
        base = f"/api/projects/{project.name}/"
        return Target(name="muster", port=self.port,
                      headers={"Authorization": f"Token {token}", "Content-Type": "application/json",
                               "Accept": "application/json"},
                      plan_path=base + "runs/plan", apply_path=base + "runs/",
                      plan_body=lambda: body, apply_body=lambda _plan: body, run_name=lambda r: r["name"])

    @property
    def target(self) -> Target:
        from bench.scenarios.common import task_yaml

        # enough hosts that every run of the row is placed meanwhile, as a user's runs would be
        return self._target("submit", task_yaml(4), 400)

    def nocap_target(self) -> Target:
        from bench.scenarios.common import task_yaml

        return self._target("nocap", task_yaml(4, gpu="A100:8"), 8)  # 8 CPU hosts, no GPU

    def placement_target(self, hosts: int) -> Target:
        from bench.scenarios.common import task_yaml

        return self._target(f"place{hosts}", task_yaml(4), hosts)

    def unfinished(self) -> int:
        """Runs of earlier steps still in the engine's hands (the settle before a step waits for them)."""
        from runs.choices import RUN_FINISHED
        from runs.models import Run

        return Run.objects.exclude(status__in=RUN_FINISHED).count()

    def terminal(self, names: list[str]) -> int:
        from runs.choices import RUN_FINISHED
        from runs.models import Run

        return Run.objects.filter(project=self.project, name__in=names, status__in=RUN_FINISHED).count()

    def placed(self, names: list[str]) -> int:
        from runs.models import Job

        return Job.objects.filter(run__project=self.project, run__name__in=names, instance__isnull=False).count()

    def placement_check(self, names: list[str]) -> dict:
        from django.db.models import Count

        from runs.models import Job

        twice = (Job.objects.filter(run__project=self.project, run__name__in=names, instance__isnull=False)
                 .values("instance").annotate(n=Count("id")).filter(n__gt=1).count())
        return {"hosts_with_two_jobs": twice}

    def let_go(self, names: list[str]) -> None:
        """Nothing to do: runs on hollow hosts end by themselves."""


class Dstack:
    name = "dstack"

    def __init__(self, session: harness.Session):
        self.session = session
        self.server = dstack.Server(session, harness.free_port())

    def start(self) -> None:
        self.server.start()
        self.port = self.server.port

    def _target(self, project: str, gpu: str | None = None) -> Target:
        p = dstack.paths(project)
        spec = dstack.run_spec(4, gpu)
        return Target(name="dstack", port=self.port, headers=dstack.headers(self.server.token),
                      plan_path=p["plan"], apply_path=p["apply"],
                      plan_body=lambda: dstack.plan_body(spec),
                      apply_body=lambda plan: dstack.apply_body(plan or {"run_spec": spec}),
                      run_name=lambda r: r["run_spec"]["run_name"])

    @property
    def target(self) -> Target:
        return self._target(dstack.PROJECT)

    def nocap_target(self) -> Target:
        return self._target(dstack.PROJECT, gpu="A100:8")

    def placement_target(self, hosts: int) -> Target:
        # a project of its own per step: dstack refuses to create one that exists (a second round)
        self._placements = getattr(self, "_placements", 0) + 1
        project = f"place{hosts}n{self._placements}"
        self.server.call("/api/projects/create", {"project_name": project, "is_public": False})
        dstack_seed.seed_fleet(self.server.db, project, f"idle-{hosts}", hosts)
        self._placement_project = project
        return self._target(project)

    def let_go(self, names: list[str]) -> None:
        """Abort the placement step's runs, as `dstack stop -x` would: their seeded hosts do not exist,
        so their jobs would stay provisioning and keep dstack's pipelines busy during the next step."""
        if names:
            project = self._placement_project
            self.server.call(dstack.paths(project)["stop"], {"runs_names": names, "abort": True})

    def _count(self, names: list[str], where: str) -> int:
        if not names:
            return 0
        conn = sqlite3.connect(f"file:{self.server.db}?mode=ro", uri=True, timeout=30)
        try:
            marks = ",".join("?" * len(names))
            return conn.execute(where.format(marks=marks), names).fetchone()[0]
        finally:
            conn.close()

    def unfinished(self) -> int:
        conn = sqlite3.connect(f"file:{self.server.db}?mode=ro", uri=True, timeout=30)
        try:
            return conn.execute("SELECT count(*) FROM runs WHERE NOT deleted AND upper(status) NOT IN "
                                "('TERMINATED', 'FAILED', 'DONE')").fetchone()[0]
        finally:
            conn.close()

    def terminal(self, names: list[str]) -> int:
        return self._count(names, "SELECT count(*) FROM runs WHERE run_name IN ({marks}) "
                                  "AND upper(status) IN ('TERMINATED', 'FAILED', 'DONE')")

    def placed(self, names: list[str]) -> int:
        return self._count(names, "SELECT count(*) FROM jobs JOIN runs ON runs.id = jobs.run_id "
                                  "WHERE runs.run_name IN ({marks}) AND jobs.instance_id IS NOT NULL")

    def placement_check(self, names: list[str]) -> dict:
        twice = self._count(names, "SELECT count(*) FROM (SELECT jobs.instance_id FROM jobs JOIN runs ON "
                                   "runs.id = jobs.run_id WHERE runs.run_name IN ({marks}) AND jobs.instance_id "
                                   "IS NOT NULL GROUP BY jobs.instance_id HAVING count(*) > 1)")
        return {"hosts_with_two_jobs": twice}
