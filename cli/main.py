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
from collections.abc import Callable
from typing import Any

from cli import deadlines, follow, render, service_render
from cli.client import (  # noqa: F401  (load_settings and Settings are part of the CLI's API)
    Client,
    CliError,
    Settings,
    Unreachable,
    UsageError,
    format_error,
    load_settings,
    write_config,
)
from cli.files import (  # noqa: F401  (the tests and scripts use them from here)
    bare_env_keys,
    env_values,
    inline_identity_files,
    parse_env_args,
    read_document,
)
from cli.fleets import (  # noqa: F401  (POLL_SECONDS: the tests shorten it here)
    POLL_SECONDS,
    add_fleet_commands,
    submit_fleet,
)
from cli.follow import RUN_FINISHED, say, segment
from cli.metrics import add_metrics_command
from cli.prompts import Parser, client_for, confirm
from cli.queue import add_queue_command

# ---- commands ----------------------------------------------------------------------------------------


def cmd_config(args: argparse.Namespace) -> int:
    path = write_config(args.url, args.token, args.project)
    print(f"Saved {path}")
    return 0


def task_body(args: argparse.Namespace, text: str, doc: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"configuration": text, "env": env_values(doc, parse_env_args(args.env), os.environ)}
    if args.run_args:
        body["args"] = shlex.join(args.run_args)  # fills ${{ run.args }}, as with dstack apply
    return body


def show_plan(client: Client, body: dict[str, Any]) -> dict[str, Any]:
    plan = client.post("runs/plan", body)
    jobs = plan.get("jobs") or []
    if plan.get("replicas") is not None:
        print(service_render.service_plan(plan))
    else:
        print(f"Run {plan.get('run_name')}: {len(jobs)} job(s)")
    print(render.plan_table(jobs, (plan.get("configuration") or {}).get("groups")))
    capacity = plan.get("capacity") or {}
    if capacity.get("fits") is False:  # said before asking: submitted now, the run would fail (or wait to retry)
        print(render.no_capacity(capacity.get("reasons") or []))
        if capacity.get("waits_for"):
            print(render.would_wait(capacity["waits_for"], capacity.get("queue_position")))
    elif capacity.get("fits"):
        print(render.plan_placement(capacity))
        if capacity.get("deadlines"):
            print(deadlines.plan_deadlines(capacity))
    if plan.get("warnings"):
        print(render.plan_warnings(plan["warnings"]))
    if (plan.get("replaces") or {}).get("message"):
        print(f"Note: {plan['replaces']['message']}")
    if (plan.get("updates") or {}).get("message"):
        print(f"Note: {plan['updates']['message']}")
    return plan


def submit_task(client: Client, args: argparse.Namespace, text: str, doc: dict[str, Any]) -> int:
    body = task_body(args, text, doc)
    plan = show_plan(client, body)
    updates = plan.get("updates") or {}
    if updates.get("refused"):
        raise CliError(updates["refused"])
    if updates:  # a running service of this name: rolled in place, as dstack's apply offers
        if not confirm(f"Update service {updates['name']} in place?", args.yes):
            print("Not updated.")
            return 0
        run = client.post("runs/", {**body, "update": True})
        serving = run.get("serving_deployment", run.get("deployment_num"))
        if serving != run.get("deployment_num"):  # a service with a router: blue/green
            say(f"Updating service {run['name']} to deployment {run.get('deployment_num')}: it comes up beside "
                f"deployment {serving}, which serves until the new one is ready (rolled back if it fails).")
        else:
            say(f"Updating service {run['name']} to deployment {run.get('deployment_num')}: its replicas are "
                "replaced one at a time.")
        return _service_submitted(run)
    if not confirm("Submit the run?", args.yes):
        print("Not submitted.")
        return 0
    run = client.post("runs/", body)
    name = run["name"]
    if run.get("service"):
        say(f"Submitted service {name}.")
        return _service_submitted(run)
    say(f"Submitted run {name}.")
    if args.detach:
        say(f"Follow it with: muster logs {name}")
        return 0
    return follow.follow_run(client, name)


def _service_submitted(run: dict[str, Any]) -> int:
    """A service runs until stopped: apply prints where it is served instead of following it."""
    name = run["name"]
    say(f"Service URL: {run['service']['url']}")
    say(f"Its replicas: muster ps -v; its logs: muster logs {name}; stop it: muster stop {name}")
    return 0


def _missing_type(path: str, doc: dict[str, Any]) -> None:
    if doc.get("type") is None:
        raise CliError(f"{path}: missing `type:`: write `type: task` (a run), `type: service` or `type: fleet`")


def cmd_plan(args: argparse.Namespace) -> int:
    text, doc = read_document(args.file)
    _missing_type(args.file, doc)
    if doc.get("type") not in ("task", "service"):
        raise CliError(f"{args.file}: type {doc.get('type')!r}: only a task or a service has a plan")
    show_plan(client_for(args), task_body(args, text, doc))
    return 0


def cmd_apply(args: argparse.Namespace) -> int:
    text, doc = read_document(args.file)
    _missing_type(args.file, doc)
    kind = doc.get("type")
    if kind == "fleet":
        if args.run_args:
            raise CliError(f"{args.file} is a fleet: arguments after -- only fill ${{{{ run.args }}}} of a task")
        return submit_fleet(client_for(args), args.file, text, doc)
    if kind in ("task", "service"):
        return submit_task(client_for(args), args, text, doc)
    raise CliError(f"{args.file}: type {kind!r} is not supported here: use type: task, service or fleet")


def select_runs(runs: list[dict[str, Any]], show_all: bool, finished_shown: int = 10) -> list[dict[str, Any]]:
    """Unfinished runs and the latest finished ones (the API lists newest first)."""
    if show_all:
        return runs
    finished = [r for r in runs if r.get("status") in RUN_FINISHED][:finished_shown]
    keep = {id(r) for r in finished}
    return [r for r in runs if r.get("status") not in RUN_FINISHED or id(r) in keep]


def cmd_ps(args: argparse.Namespace) -> int:
    runs = select_runs(client_for(args).get_pages("runs/"), args.all)
    if not runs:
        print("No runs.")
    else:
        print(render.jobs_table(runs) if args.verbose else render.runs_table(runs))
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    return follow.follow_logs(client_for(args), args.run, args.job, args.group, follow=not args.no_follow,
                              submission=args.submission)


def cmd_attach(args: argparse.Namespace) -> int:
    from cli.attach import attach, parse_port_maps

    return attach(client_for(args), args.run, args.job, parse_port_maps(args.port))


def cmd_ssh(args: argparse.Namespace) -> int:
    from cli.ssh import ssh

    return ssh(client_for(args), args.run, args.job, args.remote_command)


def cmd_events(args: argparse.Namespace) -> int:
    client = client_for(args)
    follow.get_run(client, args.run)  # a 404 for a run that does not exist, not an empty table
    events = client.get("events/", run=args.run, limit=args.limit)
    print(render.events_table(events) if events else f"No events for run {args.run}.")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    client = client_for(args)
    if not confirm(f"Delete run {args.run}?", args.yes):
        print("Not deleted.")
        return 0
    client.delete(f"runs/{segment(args.run)}/")
    print(f"run {args.run}: deleted")
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    client = client_for(args)
    verb = "Abort" if args.abort else "Stop"
    if not confirm(f"{verb} run {args.run}?", args.yes):
        print("Not stopped.")
        return 0
    run = client.post(f"runs/{segment(args.run)}/stop", {"abort": args.abort})
    if run.get("status") in RUN_FINISHED:
        print(f"run {args.run}: {run.get('status')}")  # it had ended already: nothing to stop
        return 0
    # the answer still says `running`: the jobs are stopped after it, by the worker
    print(f"run {args.run}: {'aborting' if args.abort else 'stopping'} (muster ps shows when it has ended)")
    return 0


def cmd_instances(args: argparse.Namespace) -> int:
    client = client_for(args)
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

    return serve(args.bind, args.concurrency, verbose=args.verbose, dev=args.dev, gateway_port=args.gateway_port)


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("muster")
    except PackageNotFoundError:
        return "unknown (not installed)"


# ---- argument parsing ----------------------------------------------------------------------------------


def _add_yes(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")


def _command(subparsers: Any, name: str, handler: Callable[[argparse.Namespace], int], **kw: Any):
    parser = subparsers.add_parser(name, **kw)
    # On every command (not the top level) so it can be written after the command, like other options.
    parser.add_argument("--project", help="project name (default: MUSTER_PROJECT, ~/.muster/config, or main)")
    parser.set_defaults(handler=handler)
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="muster", description="Client of a Muster control plane.")
    parser.add_argument("--version", action="version", version=f"muster {version()}")
    sub = parser.add_subparsers(dest="command", required=True,
                                metavar="{config,apply,plan,ps,queue,logs,metrics,attach,ssh,events,stop,delete,fleet,instances,serve}")

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

    plan = _command(sub, "plan", cmd_plan, help="show a task's jobs and where they would run, submitting nothing")
    plan.add_argument("-f", "--file", required=True)
    plan.add_argument("-e", "--env", action="append", metavar="KEY=VALUE",
                      help="value for a bare KEY in the configuration's env (repeatable)")
    plan.add_argument("run_args", nargs="*", metavar="-- ARGS", help="after --: fills ${{ run.args }}")

    ps = _command(sub, "ps", cmd_ps, help="list runs")
    ps.add_argument("-a", "--all", action="store_true", help="include every finished run")
    ps.add_argument("-v", "--verbose", action="store_true",
                    help="one row per job: group, rank, host, IP, status, reason")

    logs = _command(sub, "logs", cmd_logs, help="print the jobs' logs, following them until they finish")
    logs.add_argument("run")
    logs.add_argument("--job", type=int, help="only this job (its log as written, without prefixes)")
    logs.add_argument("--group", help="only the jobs of this group")
    logs.add_argument("--submission", type=int, help="the jobs of this submission: an earlier attempt's logs, "
                                                      "e.g. the failure a group restart followed")
    logs.add_argument("-n", "--no-follow", action="store_true", help="print what is there now and exit")
    # the default since logs follow; still accepted so `muster logs RUN -f` keeps working
    logs.add_argument("-f", "--follow", action="store_true", help=argparse.SUPPRESS)

    add_metrics_command(sub, _command)
    add_queue_command(sub, _command)

    attach = _command(sub, "attach", cmd_attach,
                      help="forward a job's ports to localhost and follow the logs until Ctrl-C")
    attach.add_argument("run")
    attach.add_argument("--job", type=int, default=0, help="job number (default 0, the master)")
    attach.add_argument("-p", "--port", action="append", metavar="LOCAL:JOB_PORT",
                        help="local port for a job port (default: the same number, or a free one)")

    shell = _command(sub, "ssh", cmd_ssh, help="a shell, or one command, in a job's environment (its container)")
    shell.add_argument("run")
    shell.add_argument("--job", type=int, default=0, help="job number (default 0, the master)")
    shell.set_defaults(remote_command=[])  # `-- COMMAND` (split off in main): run it and exit with its status

    events = _command(sub, "events", cmd_events, help="a run's events, oldest first")
    events.add_argument("run")
    events.add_argument("--limit", type=int, default=500, help="at most this many, the latest (default 500)")

    delete = _command(sub, "delete", cmd_delete, help="delete a finished run")
    delete.add_argument("run")
    _add_yes(delete)

    stop = _command(sub, "stop", cmd_stop, help="stop a run")
    stop.add_argument("run")
    stop.add_argument("--abort", action="store_true", help="kill the jobs without a graceful stop")
    _add_yes(stop)

    add_fleet_commands(sub, _command, _add_yes)

    instances = _command(sub, "instances", cmd_instances, help="list hosts grouped by instance group")
    instances.add_argument("--fleet")
    instances.add_argument("--status")

    serve = _command(sub, "serve", cmd_serve, help="run the server: web, Celery worker and beat")
    serve.add_argument("--bind", default="127.0.0.1:8000")
    serve.add_argument("--concurrency", type=int, default=2)
    serve.add_argument("--gateway-port", type=int, default=None, metavar="PORT",
                       help="the dstack CLI's SSH gateway's port, on --bind's host (default: MUSTER_DSTACK_SSH_PORT, 2222)")
    serve.add_argument("--dev", action="store_true",
                       help="serve the web with Django's development server instead of gunicorn")
    serve.add_argument("-v", "--verbose", action="store_true",
                       help="show the web, worker and beat output here instead of in files under the data directory")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    # `muster ssh RUN -- COMMAND`: what follows `--` is the command, whatever it looks like
    # (argparse's subcommands do not keep `--` for a positional list); apply's and plan's `-- ARGS`
    # (${{ run.args }}) are argparse's own and are left to it
    verb = next((a for a in argv if not a.startswith("-")), None)
    split = verb == "ssh" and "--" in argv
    command = argv[argv.index("--") + 1:] if split else []
    argv = argv[:argv.index("--")] if split else argv
    try:
        args = parser.parse_args(argv)
        if command:
            args.remote_command = command
    except SystemExit as exc:  # --help (0) or a usage error (2): return it like any other outcome
        return exc.code if isinstance(exc.code, int) else 2
    try:
        return args.handler(args)
    except UsageError as exc:
        parser.print_usage(sys.stderr)
        print(f"muster: error: {exc}", file=sys.stderr)
        return exc.code
    except CliError as exc:
        # one shape for every error, the server's (one line per problem, its field path first) too
        for line in str(exc).splitlines() or [""]:
            print(f"error: {line}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (`muster logs RUN | head`): stop quietly, as `cat` does, and let
        # nothing flush into the closed pipe at exit (Python would print a traceback for it)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a writer killed by the closed pipe


if __name__ == "__main__":
    sys.exit(main())
