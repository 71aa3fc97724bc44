"""Following a run from the CLI: every job's log (lines prefixed `[group/rank]`), job status
changes, and the summary `apply` ends with.

Only the REST API is used: GET runs/<name>/ for the jobs and their statuses, GET runs/<name>/logs
for each job's bytes from an offset, with the time each line was written (its `times`): the lines of
many jobs are printed in that order.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from cli import render
from cli.client import Client, CliError, Unreachable

# How often the follow loops ask the server for news.
POLL_SECONDS = 1.0
# A follow loop reads at most this many log chunks of one job per tick, so a chatty job cannot
# starve the others or the status updates.
MAX_LOG_CHUNKS_PER_TICK = 16
# Lines of a failed job's log repeated in the summary `apply` ends with.
TAIL_LINES = 10
# A line longer than this without a newline is printed as it is rather than buffered without end.
MAX_PARTIAL_LINE = 64 * 1024
RUN_FINISHED = frozenset({"done", "failed", "terminated"})
JOB_FINISHED = frozenset({"done", "failed", "terminated", "aborted"})
# A job in one of these has no process yet, so it has no log to ask for.
JOB_NOT_STARTED = frozenset({"submitted", "provisioning", "pulling"})


def segment(name: str) -> str:
    return quote(name, safe="")


def say(message: str) -> None:
    """Status lines go to stderr so stdout carries only the jobs' logs (and tables)."""
    print(message, file=sys.stderr, flush=True)


def write_out(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def label(job: Mapping[str, Any]) -> str:
    return f"{job.get('node_group_name')}/{job.get('node_group_rank')}"


class JobLog:
    """What has been read of one job's log: the byte offset, an unfinished last line, the tail."""

    def __init__(self, job: Mapping[str, Any], submission: int | None = None):
        self.num = job["job_num"]
        self.submission = submission  # None: the current job of its number
        self.label = label(job)
        self.offset = 0
        self.partial = ""
        self.partial_ms: int | None = None  # the time of the line begun and not ended yet
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.drained = False


class LogFollower:
    """Reads the logs of the selected jobs of one run and prints them, line by line.

    With `prefix`, each line starts with `[group/rank] ` so the logs of many jobs can share one
    terminal; a job's bytes are cut into lines here, so a line is never split between jobs.
    """

    def __init__(self, client: Client, run: str, job: int | None = None, group: str | None = None,
                 prefix: bool = True, submission: int | None = None):
        self.client, self.run = client, run
        self.job, self.group, self.prefix = job, group, prefix
        # an earlier attempt's jobs (the run's `earlier_jobs`) rather than the current ones
        self.submission = submission
        self.logs: dict[tuple[int, int | None], JobLog] = {}
        self.pending: list[tuple[int, int, str]] = []  # (ms, order, line) of a tick, printed in time order

    def jobs_of(self, run: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        jobs = run.get("jobs") or []
        if self.submission is None:
            return jobs
        every = [*(run.get("earlier_jobs") or []), *jobs]
        return [j for j in every if j.get("submission_num") == self.submission]

    def selected(self, jobs: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        return [j for j in jobs if (self.job is None or j.get("job_num") == self.job)
                and (self.group is None or j.get("node_group_name") == self.group)]

    def check_selection(self, run: Mapping[str, Any]) -> None:
        jobs = self.jobs_of(run)
        if self.selected(jobs):
            return
        if self.submission is not None:
            known = sorted({j.get("submission_num") for j in [*(run.get("earlier_jobs") or []), *(run.get("jobs") or [])]})
            raise CliError(f"run {self.run} has no {'job ' + str(self.job) if self.job is not None else 'jobs'} "
                           f"in submission {self.submission} (submissions: {', '.join(map(str, known))})")
        if self.job is not None:
            raise CliError(f"run {self.run} has no job {self.job} (jobs 0..{len(jobs) - 1})")
        groups = sorted({str(j.get("node_group_name")) for j in jobs})
        raise CliError(f"run {self.run} has no group {self.group!r} (groups: {', '.join(groups) or 'none'})")

    def tick(self, run: Mapping[str, Any], final: bool = False) -> None:
        """Print what is new in each selected job's log; `final`: the run has ended, read to the end."""
        for job in self.selected(self.jobs_of(run)):
            # a retry or a restart of its group makes a job a new row with a log of its own
            key = (job["job_num"], job.get("submission_num"))
            state = self.logs.get(key)
            if state is None:
                state = self.logs[key] = JobLog(job, self.submission)
            if state.drained or (job.get("status") in JOB_NOT_STARTED and not final):
                continue
            # the logs answer carries the job's status too, newer than the run's by a request
            status = self.read(state)
            if job.get("status") in JOB_FINISHED or status in JOB_FINISHED or final:
                self.read(state)  # what was stored as the job ended
                self.flush(state)
                state.drained = True
        self.print_pending()

    def read(self, state: JobLog) -> str | None:
        status = None
        for _ in range(MAX_LOG_CHUNKS_PER_TICK):
            try:
                where = {} if state.submission is None else {"submission": state.submission}
                data = self.client.get(f"runs/{segment(self.run)}/logs", job=state.num, start=state.offset, **where)
            except Unreachable:
                raise
            except CliError:
                return status  # e.g. the job was replaced by a retry; the next tick sees the new rows
            status = data.get("status")
            if data.get("text"):
                self.emit(state, data["text"], data.get("times"))
            # `next` is a byte offset: counting characters of the decoded text would drift on UTF-8
            if data["next"] <= state.offset:
                return status
            state.offset = data["next"]
        return status

    def emit(self, state: JobLog, text: str, times: list | None = None) -> None:
        """Cut the job's text into lines, each with its time (the answer's [ms, lines] runs, for the
        lines beginning in it; a server without them: 0, the lines keep the order they were read in)."""
        stamps = _expand(times)
        pieces = text.split("\n")
        lines: list[tuple[int, str]] = []
        for index, piece in enumerate(pieces):
            ending = index < len(pieces) - 1
            if index == 0 and state.partial_ms is not None:
                ms, piece = state.partial_ms, state.partial + piece
            elif not ending and not piece:
                break
            else:
                ms = next(stamps, state.partial_ms or 0)
            if ending:
                lines.append((ms, piece))
                state.partial, state.partial_ms = "", None
            else:
                state.partial, state.partial_ms = piece, ms
        if len(state.partial) > MAX_PARTIAL_LINE:  # printed as it is; its rest still carries its time
            lines.append((state.partial_ms or 0, state.partial))
            state.partial = ""
        self.print_lines(state, lines)

    def flush(self, state: JobLog) -> None:
        if state.partial:
            self.print_lines(state, [(state.partial_ms or 0, state.partial)])
        state.partial, state.partial_ms = "", None

    def print_lines(self, state: JobLog, lines: list[tuple[int, str]]) -> None:
        if not lines:
            return
        state.tail.extend(line for _, line in lines)
        if not self.prefix:
            write_out("".join(f"{line}\n" for _, line in lines))
            return
        head = f"[{state.label}] "
        self.pending.extend((ms, len(self.pending), f"{head}{line}\n") for ms, line in lines)

    def print_pending(self) -> None:
        """The lines every job gave in this tick, in the order they were written."""
        if self.pending:
            write_out("".join(line for _, _, line in sorted(self.pending)))
            self.pending = []

    def all_drained(self, run: Mapping[str, Any]) -> bool:
        jobs = self.selected(self.jobs_of(run))
        return all((state := self.logs.get((j["job_num"], j.get("submission_num")))) and state.drained for j in jobs)


def _expand(runs: list | None):
    for entry in runs or []:
        if isinstance(entry, list) and len(entry) == 2 and all(isinstance(v, int) for v in entry):
            yield from [entry[0]] * max(0, min(entry[1], 1 << 20))


def get_run(client: Client, name: str) -> dict[str, Any]:
    return client.get(f"runs/{segment(name)}/")


def follow_logs(client: Client, name: str, job: int | None, group: str | None, follow: bool,
                submission: int | None = None) -> int:
    """`muster logs`: the selected jobs' logs; with `follow`, until each of them has finished.
    `submission`: the jobs of that submission (an earlier attempt's, e.g. before a group restart)."""
    # one job asked for by number prints its log as written, so it can be piped like a file
    follower = LogFollower(client, name, job, group, prefix=job is None, submission=submission)
    try:
        run = get_run(client, name)
        follower.check_selection(run)
        while True:
            ended = run.get("status") in RUN_FINISHED
            follower.tick(run, final=ended or not follow)
            if ended or not follow or follower.all_drained(run):
                return 0
            time.sleep(POLL_SECONDS)
            run = get_run(client, name)
    except KeyboardInterrupt:
        return 0


def _job_line(job: Mapping[str, Any]) -> str:
    line = f"job {job.get('job_num')} ({label(job)}): {job.get('status')}"
    if job.get("instance"):
        ip = f" ({job['instance_ip']})" if job.get("instance_ip") else ""
        line += f" on {job['instance']}{ip}"
    if job.get("termination_reason"):
        line += f" [{job['termination_reason']}]"
    return line


class RunFollower:
    """What `apply` has already shown of one run: each job's status, the progress line, the logs."""

    def __init__(self, client: Client, name: str):
        self.client = client
        self.name = name
        self.job_status: dict[int, str] = {}
        self.progress = ""
        self.submission: int | None = None
        self.restarts: dict[str, tuple] = {}  # group -> the last restart said of it
        self.logs = LogFollower(client, name)
        self.lost_contact = False

    def poll(self) -> dict[str, Any] | None:
        try:
            run = get_run(self.client, self.name)
            self.show(run)
            self.logs.tick(run, final=run.get("status") in RUN_FINISHED)
        except Unreachable as exc:
            if not self.lost_contact:
                say(f"{exc}; still trying (Ctrl-C detaches)")
            self.lost_contact = True
            return None
        self.lost_contact = False
        return run

    def show(self, run: Mapping[str, Any]) -> None:
        self.show_restarts(run)
        submission = run.get("submission_num")
        if self.submission is not None and submission != self.submission:
            restarted = [r["group"] for r in run.get("restarts") or [] if r.get("submission") == submission]
            if restarted:
                say(f"run {self.name}: group {', '.join(restarted)} restarted (submission {submission}); "
                    f"the failed attempt's log: muster logs {self.name} --submission {self.submission}")
            else:
                say(f"run {self.name}: retried (submission {submission})")
            self.job_status = {}
        self.submission = submission
        jobs = run.get("jobs") or []
        for job in jobs:
            if self.job_status.get(job["job_num"]) != job.get("status"):
                self.job_status[job["job_num"]] = job.get("status")
                say(_job_line(job))
        progress = f"run {self.name}: {run.get('status')}  jobs: {render.status_counts(jobs)}"
        if progress != self.progress:
            self.progress = progress
            say(progress)


    def show_restarts(self, run: Mapping[str, Any]) -> None:
        """"group workers restarting (attempt 2 of 4) in 15 s: job 2 (workers/1) exited 3", once per restart.

        The restarts the run had before `apply` began following it are not news: the first poll
        only remembers them."""
        for entry in run.get("restarts") or []:
            # said once per restart, also when it started between two polls (a short back-off)
            key = (entry.get("restarts"), entry.get("cause"), entry.get("with_group"))
            if self.restarts.get(entry.get("group")) == key:
                continue
            self.restarts[entry.get("group")] = key
            if self.submission is not None:
                say(restart_line(entry))


def restart_line(entry: Mapping[str, Any]) -> str:
    wait = f" in {entry['backoff']:.0f} s" if isinstance(entry.get("backoff"), (int, float)) else ""
    if entry.get("with_group"):
        return f"group {entry.get('group')} restarting with group {entry['with_group']}{wait}: {entry.get('cause')}"
    attempt = f"attempt {entry.get('restarts', 0) + 1} of {entry.get('max_restarts', 0) + 1}"
    return f"group {entry.get('group')} restarting ({attempt}){wait}: {entry.get('cause') or 'a job failed'}"


def report_end(run: Mapping[str, Any], logs: LogFollower | None = None) -> int:
    """The per-job summary, with the last lines of each job that failed; the exit status."""
    name, status = run.get("name"), run.get("status")
    jobs = run.get("jobs") or []
    if jobs:
        say(render.jobs_summary(jobs))
    for job in jobs:
        if job.get("status") not in ("failed", "aborted"):
            continue
        state = logs.logs.get((job["job_num"], job.get("submission_num"))) if logs else None
        tail = list(state.tail) if state else []
        if job.get("termination_message"):
            say(f"job {job['job_num']} ({label(job)}): {job['termination_message']}")
        if tail:
            say(f"last lines of job {job['job_num']} ({label(job)}):")
            say("\n".join(f"  | {line}" for line in tail))
    if status == "done":
        say(f"run {name}: done")
        return 0
    reason = run.get("termination_reason") or "no reason given"
    message = f": {run['termination_message']}" if run.get("termination_message") else ""
    say(f"run {name}: {status} ({reason}){message}")
    return 1


def follow_run(client: Client, name: str) -> int:
    follower = RunFollower(client, name)
    try:
        while True:
            run = follower.poll()
            if run is not None and run.get("status") in RUN_FINISHED:
                return report_end(run, follower.logs)
            time.sleep(POLL_SECONDS)
    except KeyboardInterrupt:
        # Ctrl-C stops the following, not the run: the exit status says it was interrupted
        say(f"\nInterrupted: run {name} continues on the server. Follow it with `muster logs {name}` "
            f"(status: `muster ps -v`), stop it with `muster stop {name}`.")
        return 130
