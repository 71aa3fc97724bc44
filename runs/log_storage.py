"""What the server keeps of finished jobs' logs, and for how long.

A job's log is copied to LOG_DIR/<project id>/<job uuid>.log by the engine (engine/log_copy.py) and
read from there (runs/services/logs.py).
Output may print secrets, so a copy goes with its run (deleted, or replaced by a new run of its
name) and with its project; the retention sweep deletes the copies of runs that finished more than
LOG_RETENTION_DAYS ago; and a project holds at most its log quota: a new copy first makes room by
deleting the copies of the project's oldest finished runs, and is cut short (with a line that says
so) when even that is not enough.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from projects.models import Project
from runs.choices import RUN_FINISHED
from runs.models import Job, Run

log = logging.getLogger(__name__)
CHUNK = 1 << 20


def project_dir(project_id: int) -> Path:
    return Path(settings.MUSTER["LOG_DIR"]) / str(project_id)


def path_for(project_id: int, job_uuid) -> Path:
    return project_dir(project_id) / f"{job_uuid}.log"


def stored_path(job: Job) -> Path:
    # Keyed by the job's own UUID: a run name is reused by the next run of that name, whose
    # jobs must never be shown the previous run's output.
    return path_for(job.run.project_id, job.uuid)


def truncated_note(limit: int) -> bytes:
    return f"\n[muster: the server kept the first {limit} bytes of this log (MUSTER_LOG_COPY_LIMIT)]\n".encode()


def over_quota_note(kept: int, quota: int) -> bytes:
    return (f"\n[muster: the server kept the first {kept} bytes of this log: the project's logs reached their "
            f"quota of {quota} bytes (MUSTER_LOG_QUOTA)]\n").encode()


def _unlink(paths: list[Path]) -> int:
    freed = 0
    for path in paths:
        path.with_suffix(".times").unlink(missing_ok=True)  # its lines' times (runs/log_stamps.py)
        try:
            size = path.stat().st_size
            path.unlink()
            freed += size
        except FileNotFoundError:
            pass
    return freed


def forget_run_on_commit(run: Run) -> None:
    """Before a run's rows go: its jobs' copies go once the deletion is committed (a rolled back
    deletion keeps them)."""
    paths = [path_for(run.project_id, uuid) for uuid in Job.objects.filter(run_id=run.pk).values_list("uuid", flat=True)]
    if paths:
        transaction.on_commit(lambda: _unlink(paths))


def forget_project_on_commit(project_id: int) -> None:
    where = project_dir(project_id)
    transaction.on_commit(lambda: shutil.rmtree(where, ignore_errors=True))


def quota_for(project_id: int) -> int:
    """Bytes of finished jobs' logs the project may hold (0: no quota)."""
    own = Project.objects.filter(pk=project_id).values_list("log_quota", flat=True).first()
    return int(own if own is not None else settings.MUSTER["LOG_QUOTA"])


def quota_of(run) -> int:
    """quota_for the run's project, from its row when the caller read it with the run."""
    if Run._meta.get_field("project").is_cached(run):
        own = run.project.log_quota
        return int(own if own is not None else settings.MUSTER["LOG_QUOTA"])
    return quota_for(run.project_id)


def _usage(project_id: int, but: Path) -> int:
    """Bytes of the project's copies but `but` (a copy in that directory, told by its name). One
    stat per copy: the project's directory holds a copy per job it ran within LOG_RETENTION_DAYS,
    so this is read only when a copy has bytes to keep (Budget), and with scandir, not pathlib's
    glob (a Path and a pattern match per file: twice the time, `python -m bench.log_usage`)."""
    total, skip = 0, but.name
    try:
        with os.scandir(project_dir(project_id)) as entries:
            for entry in entries:
                if entry.name.endswith(".log") and entry.name != skip and entry.is_file():
                    try:
                        total += entry.stat().st_size
                    except FileNotFoundError:
                        pass
    except FileNotFoundError:
        return 0
    return total


class Budget:
    """Room for one job's copy under its project's quota, made by deleting the copies of the
    project's oldest finished runs (never the job's own run) as the copy grows."""

    def __init__(self, job: Job, path: Path):
        self.job, self.path = job, path
        self.quota = quota_of(job.run)
        self._used: int | None = None
        self.taken = 0
        self._victims = None

    @property
    def used(self) -> int:
        """The project's other copies, read at the first byte to keep: a job that printed nothing
        (its copy empty) costs no read of the directory."""
        if self._used is None:
            self._used = _usage(self.job.run.project_id, self.path)
        return self._used

    @used.setter
    def used(self, value: int) -> None:
        self._used = value

    def take(self, size: int) -> int:
        """How many of `size` more bytes the copy may have (all of them, unless the quota is reached)."""
        if not self.quota:
            return size
        while self.used + self.taken + size > self.quota and self._evict_one():
            pass
        allowed = max(0, min(size, self.quota - self.used - self.taken))
        self.taken += allowed
        return allowed

    def _evict_one(self) -> bool:
        if self._victims is None:
            self._victims = iter(_finished_runs_with_logs(self.job.run.project_id, but_run=self.job.run_id))
        for name, paths in self._victims:
            freed = _unlink(paths)
            if freed:
                log.info("deleted the logs of run %s (%d bytes): project %s is over its log quota of %d bytes",
                         name, freed, self.job.run.project_id, self.quota)
                self.used = max(0, self.used - freed)
                return True
        return False


def _finished_runs_with_logs(project_id: int, but_run: int) -> list[tuple[str, list[Path]]]:
    """(run name, its log files) of the project's finished runs that have any, oldest finished first.

    Found from the files, not the runs: a project may have many old runs whose logs are gone."""
    paths = {path.stem: path for path in project_dir(project_id).glob("*.log") if _is_uuid(path.stem)}
    stems, runs = list(paths), {}
    for start in range(0, len(stems), BATCH):
        rows = Job.objects.filter(uuid__in=stems[start:start + BATCH], run__project_id=project_id,
                                  run__status__in=RUN_FINISHED).exclude(run_id=but_run).values_list(
            "uuid", "run_id", "run__name", "run__finished_at")
        for job_uuid, run_id, name, finished_at in rows:
            entry = runs.setdefault(run_id, [finished_at, run_id, name, []])
            entry[3].append(paths[str(job_uuid)])
    oldest_first = sorted(runs.values(), key=lambda e: (e[0] is None, e[0] or 0, e[1]))
    return [(name, files) for _, _, name, files in oldest_first]


def sweep_retention(now=None) -> int:
    """Delete the copies of runs finished more than LOG_RETENTION_DAYS ago, and copies whose job is
    gone; how many files went."""
    days = float(settings.MUSTER["LOG_RETENTION_DAYS"])
    root = Path(settings.MUSTER["LOG_DIR"])
    if not root.is_dir():
        return 0
    cutoff = (now or timezone.now()) - timedelta(days=days)
    removed = 0
    for where in root.iterdir():
        if not where.is_dir():
            continue
        for times in where.glob("*.times"):
            if not times.with_suffix(".log").exists():
                times.unlink(missing_ok=True)  # its log went (a full disk while copying it)
        paths = sorted(where.glob("*.log"))
        # in batches: SQLite takes a bounded number of query parameters
        for start in range(0, len(paths), BATCH):
            old = _expired(paths[start:start + BATCH], days, cutoff)
            _unlink(old)
            removed += len(old)
    return removed


BATCH = 500


def _expired(paths: list[Path], days: float, cutoff) -> list[Path]:
    known = {str(uuid): (status, finished_at) for uuid, status, finished_at in Job.objects.filter(
        uuid__in=[p.stem for p in paths if _is_uuid(p.stem)]).values_list("uuid", "run__status", "run__finished_at")}
    old = []
    for path in paths:
        if path.stem not in known:
            old.append(path)  # its job is gone (its run deleted while the copy was being written)
            continue
        status, finished_at = known[path.stem]
        if days > 0 and status in RUN_FINISHED and finished_at is not None and finished_at < cutoff:
            old.append(path)
    return old


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True
