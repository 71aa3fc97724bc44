"""`muster`: a thin command-line client of the Muster REST API.

Standard library HTTP (urllib) and PyYAML only, so the client installs anywhere the server's
dependencies would be too heavy. The server validates everything; the client only reads files,
fills what only the client can know (local env values, SSH key contents) and renders answers.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import yaml

from muster import cli_render as render
from muster.cli_client import (  # noqa: F401  (load_settings and Settings are part of the CLI's API)
    Client,
    CliError,
    Settings,
    Unreachable,
    UsageError,
    format_error,
    load_settings,
    write_config,
)

# How often `apply` and `logs -f` ask the server for news.
POLL_SECONDS = 1.0
# A follow loop reads at most this many log chunks per tick, so a chatty job cannot starve the
# status updates.
MAX_LOG_CHUNKS_PER_TICK = 16
RUN_FINISHED = frozenset({"done", "failed", "terminated"})
JOB_FINISHED = frozenset({"done", "failed", "terminated", "aborted"})


def segment(name: str) -> str:
    return quote(name, safe="")


# ---- reading configuration files ----------------------------------------------------------------


def read_document(path: str) -> tuple[str, dict[str, Any]]:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CliError(f"{path}: invalid YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise CliError(f"{path}: the configuration must be a mapping (type: task or type: fleet)")
    return text, doc


def parse_env_args(items: list[str] | None) -> dict[str, str]:
    values: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--env {item!r}: expected KEY=VALUE")
        values[key] = value
    return values


def _bare_keys(env: object) -> list[str]:
    if isinstance(env, list):
        return [item.strip() for item in env if isinstance(item, str) and "=" not in item]
    if isinstance(env, dict):
        return [str(k) for k, v in env.items() if v is None]
    return []


def bare_env_keys(doc: Mapping[str, Any]) -> list[str]:
    """Keys written without a value, at the top level and in every group."""
    keys = _bare_keys(doc.get("env"))
    for group in doc.get("groups") or []:
        if isinstance(group, dict):
            keys += _bare_keys(group.get("env"))
    return list(dict.fromkeys(keys))


def env_values(doc: Mapping[str, Any], given: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """--env values, plus each bare key found in the local environment (--env wins).

    Only bare keys are taken from the environment: the rest of it is none of the server's business.
    """
    local = {key: environ[key] for key in bare_env_keys(doc) if key in environ}
    return {**local, **given}


def _read_key(path: str, base: Path, loc: str) -> str:
    key_path = Path(path).expanduser()
    if not key_path.is_absolute():
        # Like docker compose: a relative path means relative to the file that wrote it, so a
        # fleet file works from any working directory.
        key_path = base / key_path
    try:
        return key_path.read_text()
    except OSError as exc:
        raise CliError(f"{loc}: cannot read {key_path}: {exc.strerror or exc}") from None


def _inline_key(section: dict[str, Any], base: Path, loc: str) -> bool:
    if "identity_file" not in section:
        return False
    section["private_key"] = _read_key(str(section.pop("identity_file")), base, f"{loc} -> identity_file")
    return True


def inline_identity_files(doc: dict[str, Any], base: Path) -> bool:
    """Replace every ssh_config identity_file with the key's content (the server never sees client
    paths). Changes `doc` in place; True when something was replaced."""
    ssh = doc.get("ssh_config")
    if not isinstance(ssh, dict):
        return False
    changed = _inline_key(ssh, base, "ssh_config")
    for i, host in enumerate(ssh.get("hosts") or []):
        if isinstance(host, dict):
            changed = _inline_key(host, base, f"ssh_config -> hosts -> {i}") or changed
    return changed


# ---- prompts and output ---------------------------------------------------------------------------


def confirm(question: str, assume_yes: bool) -> bool:
    if assume_yes:
        return True
    if not sys.stdin.isatty():
        raise CliError(f"{question} needs an answer, but stdin is not a terminal: pass -y to confirm")
    try:
        answer = input(f"{question} [y/N] ")
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def say(message: str) -> None:
    """Status lines go to stderr so stdout carries only the job's log (and tables)."""
    print(message, file=sys.stderr, flush=True)


def write_log(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


# ---- following a run --------------------------------------------------------------------------------


def read_log(client: Client, run: str, job: int, start: int) -> tuple[int, str | None]:
    """Print the log of one job from byte offset `start`; return the next offset and the job status."""
    status = None
    for _ in range(MAX_LOG_CHUNKS_PER_TICK):
        data = client.get(f"runs/{segment(run)}/logs", job=job, start=start)
        status = data.get("status")
        if data.get("text"):
            write_log(data["text"])
        # `next` is a byte offset: counting characters of the decoded text would drift on UTF-8.
        if data["next"] <= start:
            break
        start = data["next"]
    return start, status


def _job_line(job: Mapping[str, Any]) -> str:
    line = f"job {job.get('job_num')} ({job.get('node_group_name')}/{job.get('node_group_rank')}): {job.get('status')}"
    if job.get("instance"):
        ip = f" ({job['instance_ip']})" if job.get("instance_ip") else ""
        line += f" on {job['instance']}{ip}"
    if job.get("termination_reason"):
        line += f" [{job['termination_reason']}]"
    return line


class RunFollower:
    """What `apply` has already shown of one run: each job's status, the progress line, job 0's log."""

    def __init__(self, client: Client, name: str):
        self.client = client
        self.name = name
        self.job_status: dict[int, str] = {}
        self.progress = ""
        self.submission: int | None = None
        self.log_offset = 0
        self.lost_contact = False

    def poll(self) -> dict[str, Any] | None:
        try:
            run = self.client.get(f"runs/{segment(self.name)}/")
            self.show(run)
            self.read_master_log()
        except Unreachable as exc:
            if not self.lost_contact:
                say(f"{exc}; still trying (Ctrl-C detaches)")
            self.lost_contact = True
            return None
        self.lost_contact = False
        return run

    def show(self, run: Mapping[str, Any]) -> None:
        submission = run.get("submission_num")
        if self.submission is not None and submission != self.submission:
            # A retry makes new job rows with their own logs: start both over.
            say(f"run {self.name}: resubmitted (submission {submission})")
            self.job_status, self.log_offset = {}, 0
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

    def read_master_log(self) -> None:
        try:
            self.log_offset, _ = read_log(self.client, self.name, 0, self.log_offset)
        except Unreachable:
            raise
        except CliError:
            pass  # e.g. job 0 replaced mid-retry; the next tick reads it


def report_end(run: Mapping[str, Any]) -> int:
    name, status = run.get("name"), run.get("status")
    if status == "done":
        say(f"run {name}: done")
        return 0
    reason = run.get("termination_reason") or "no reason given"
    message = f": {run['termination_message']}" if run.get("termination_message") else ""
    say(f"run {name}: {status} ({reason}){message}")
    for job in run.get("jobs") or []:
        if job.get("status") in ("failed", "aborted") or job.get("termination_message"):
            detail = f": {job['termination_message']}" if job.get("termination_message") else ""
            say(f"  job {job.get('job_num')}: {job.get('status')} ({job.get('termination_reason')}){detail}")
    return 1


def follow_run(client: Client, name: str) -> int:
    follower = RunFollower(client, name)
    try:
        while True:
            run = follower.poll()
            if run is not None and run.get("status") in RUN_FINISHED:
                follower.read_master_log()  # whatever was written between the last read and the end
                return report_end(run)
            time.sleep(POLL_SECONDS)
    except KeyboardInterrupt:
        say(f"\nDetached; run {name} keeps going. Re-attach with: muster logs {name} -f")
        return 0


# ---- commands ----------------------------------------------------------------------------------------


def _client(args: argparse.Namespace) -> Client:
    return Client(load_settings(args.project))


def cmd_config(args: argparse.Namespace) -> int:
    path = write_config(args.url, args.token, args.project)
    print(f"Saved {path}")
    return 0


def submit_fleet(client: Client, path: str, text: str, doc: dict[str, Any]) -> int:
    configuration: str | dict[str, Any] = text
    if inline_identity_files(doc, Path(path).resolve().parent):
        configuration = doc  # the API takes a parsed document as well as YAML text
    fleet = client.post("fleets/", {"configuration": configuration})
    if fleet.get("warnings"):
        print(render.plan_warnings(fleet["warnings"]))
    if fleet.get("status") == "pending":
        fleet = wait_for_fleet(client, fleet)
    print(render.fleet_summary(fleet))
    if fleet.get("status") == "failed":
        for error in fleet.get("errors") or []:
            say(f"error: {format_error(error)}")
        return 1
    return 0


FLEET_WAIT_SECONDS = 900.0


def wait_for_fleet(client: Client, fleet: dict[str, Any], poll: float = POLL_SECONDS,
                   timeout: float = FLEET_WAIT_SECONDS) -> dict[str, Any]:
    """Poll a pending SSH fleet until the server has registered (or refused) every host, saying
    each host's progress as it changes."""
    name = fleet.get("name") or ""
    shown: dict[str, Any] = {}
    deadline = time.monotonic() + timeout
    while True:
        for inst in fleet.get("instances") or []:
            step = inst.get("registration")
            if step and shown.get(inst.get("name")) != step:
                shown[inst.get("name")] = step
                say(f"{inst.get('name')} ({inst.get('hostname')}:{inst.get('port')}): {step}")
        if fleet.get("status") != "pending":
            return fleet
        if time.monotonic() > deadline:
            raise CliError(f"fleet {name} is still registering after {timeout:g} s; "
                           f"see `muster fleet list` (or delete it with `muster fleet delete {name}`)")
        time.sleep(poll)
        fleet = client.get(f"fleets/{segment(name)}/")


def submit_task(client: Client, args: argparse.Namespace, text: str, doc: dict[str, Any]) -> int:
    body: dict[str, Any] = {"configuration": text, "env": env_values(doc, parse_env_args(args.env), os.environ)}
    if args.run_args:
        body["args"] = shlex.join(args.run_args)  # fills ${{ run.args }}, as with dstack apply
    plan = client.post("runs/plan", body)
    jobs = plan.get("jobs") or []
    print(f"Run {plan.get('run_name')}: {len(jobs)} job(s)")
    print(render.plan_table(jobs, (plan.get("configuration") or {}).get("groups")))
    capacity = plan.get("capacity") or {}
    if capacity.get("fits") is False:  # said before asking: submitted now, the run would fail (or wait to retry)
        print(render.no_capacity(capacity.get("reasons") or []))
    if plan.get("warnings"):
        print(render.plan_warnings(plan["warnings"]))
    if not confirm("Submit the run?", args.yes):
        print("Not submitted.")
        return 0
    run = client.post("runs/", body)
    name = run["name"]
    say(f"Submitted run {name}.")
    if args.detach:
        say(f"Follow it with: muster logs {name} -f")
        return 0
    return follow_run(client, name)


def cmd_apply(args: argparse.Namespace) -> int:
    text, doc = read_document(args.file)
    kind = doc.get("type")
    if kind == "fleet":
        if args.run_args:
            raise CliError(f"{args.file} is a fleet: arguments after -- only fill ${{{{ run.args }}}} of a task")
        return submit_fleet(_client(args), args.file, text, doc)
    if kind == "task":
        return submit_task(_client(args), args, text, doc)
    raise CliError(f"{args.file}: type {kind!r} is not supported here: use type: task or type: fleet")


def cmd_fleet_apply(args: argparse.Namespace) -> int:
    text, doc = read_document(args.file)
    if doc.get("type", "fleet") != "fleet":
        raise CliError(f"{args.file}: type is {doc.get('type')!r}, not fleet: use `muster apply -f`")
    return submit_fleet(_client(args), args.file, text, doc)


def cmd_fleet_list(args: argparse.Namespace) -> int:
    fleets = _client(args).get("fleets/")
    print(render.fleets_table(fleets) if fleets else "No fleets.")
    return 0


def cmd_fleet_delete(args: argparse.Namespace) -> int:
    client = _client(args)
    if not confirm(f"Delete fleet {args.name}{' (force)' if args.force else ''}?", args.yes):
        print("Not deleted.")
        return 0
    client.delete(f"fleets/{segment(args.name)}/", force="true" if args.force else None)
    print(f"Fleet {args.name}: deleting")
    return 0


def select_runs(runs: list[dict[str, Any]], show_all: bool, finished_shown: int = 10) -> list[dict[str, Any]]:
    """Unfinished runs and the latest finished ones (the API lists newest first)."""
    if show_all:
        return runs
    finished = [r for r in runs if r.get("status") in RUN_FINISHED][:finished_shown]
    keep = {id(r) for r in finished}
    return [r for r in runs if r.get("status") not in RUN_FINISHED or id(r) in keep]


def cmd_ps(args: argparse.Namespace) -> int:
    runs = select_runs(_client(args).get("runs/"), args.all)
    print(render.runs_table(runs) if runs else "No runs.")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    client = _client(args)
    offset = 0
    try:
        while True:
            offset, status = read_log(client, args.run, args.job, offset)
            if not args.follow:
                return 0
            if status in JOB_FINISHED:
                read_log(client, args.run, args.job, offset)  # the tail stored as the job ended
                return 0
            time.sleep(POLL_SECONDS)
    except KeyboardInterrupt:
        return 0


def cmd_stop(args: argparse.Namespace) -> int:
    client = _client(args)
    verb = "Abort" if args.abort else "Stop"
    if not confirm(f"{verb} run {args.run}?", args.yes):
        print("Not stopped.")
        return 0
    run = client.post(f"runs/{segment(args.run)}/stop", {"abort": args.abort})
    print(f"run {args.run}: {run.get('status')}")
    return 0


def cmd_instances(args: argparse.Namespace) -> int:
    client = _client(args)
    rows = client.get("instances/", fleet=args.fleet, status=args.status)
    if not rows:
        print("No instances.")
        return 0
    groups = client.get("instance-groups/") if any(r.get("group") for r in rows) else []
    print(render.instances_tree(rows, groups))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "muster.settings")
    # Imported here: the client commands must work where the server's dependencies are absent.
    from muster.serve import serve

    return serve(args.bind, args.concurrency)


# ---- argument parsing ----------------------------------------------------------------------------------


def _add_yes(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")


def _command(subparsers: Any, name: str, handler: Callable[[argparse.Namespace], int], **kw: Any):
    parser = subparsers.add_parser(name, **kw)
    # On every command (not the top level) so it can be written after the command, like other options.
    parser.add_argument("--project", help="project name (default: MUSTER_PROJECT, ~/.muster/config, or main)")
    parser.set_defaults(handler=handler)
    return parser


def _add_fleet_commands(subparsers: Any) -> None:
    fleet = subparsers.add_parser("fleet", help="apply, list and delete fleets")
    actions = fleet.add_subparsers(dest="fleet_command", required=True, metavar="{apply,list,delete}")
    apply = _command(actions, "apply", cmd_fleet_apply, help="create a fleet from a YAML file")
    apply.add_argument("-f", "--file", required=True)
    _command(actions, "list", cmd_fleet_list, help="list fleets")
    delete = _command(actions, "delete", cmd_fleet_delete, help="delete a fleet and its instances")
    delete.add_argument("name")
    delete.add_argument("--force", action="store_true", help="delete even if runs use it")
    _add_yes(delete)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="muster", description="Client of a Muster control plane.")
    sub = parser.add_subparsers(dest="command", required=True,
                                metavar="{config,apply,ps,logs,stop,fleet,instances,serve}")

    config = _command(sub, "config", cmd_config, help="save the server URL and token to ~/.muster/config")
    config.add_argument("--url", required=True)
    config.add_argument("--token", required=True)

    apply = _command(sub, "apply", cmd_apply, help="submit a task or create a fleet from a YAML file")
    apply.add_argument("-f", "--file", required=True)
    _add_yes(apply)
    apply.add_argument("-d", "--detach", action="store_true", help="return once the run is submitted")
    apply.add_argument("-e", "--env", action="append", metavar="KEY=VALUE",
                       help="value for a bare KEY in the configuration's env (repeatable)")
    apply.add_argument("run_args", nargs="*", metavar="-- ARGS",
                       help="after --: the arguments that fill ${{ run.args }} in the commands")

    ps = _command(sub, "ps", cmd_ps, help="list runs")
    ps.add_argument("-a", "--all", action="store_true", help="include every finished run")

    logs = _command(sub, "logs", cmd_logs, help="print a job's log")
    logs.add_argument("run")
    logs.add_argument("--job", type=int, default=0, help="job number (default 0, the master)")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing until the job finishes")

    stop = _command(sub, "stop", cmd_stop, help="stop a run")
    stop.add_argument("run")
    stop.add_argument("--abort", action="store_true", help="kill the jobs without a graceful stop")
    _add_yes(stop)

    _add_fleet_commands(sub)

    instances = _command(sub, "instances", cmd_instances, help="list hosts grouped by instance group")
    instances.add_argument("--fleet")
    instances.add_argument("--status")

    serve = _command(sub, "serve", cmd_serve, help="run the server: web, Celery worker and beat")
    serve.add_argument("--bind", default="127.0.0.1:8000")
    serve.add_argument("--concurrency", type=int, default=2)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2): return it like any other outcome
        return exc.code if isinstance(exc.code, int) else 2
    try:
        return args.handler(args)
    except UsageError as exc:
        parser.print_usage(sys.stderr)
        print(f"muster: error: {exc}", file=sys.stderr)
        return exc.code
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
