"""The runner's command line: ``python3 muster_runner.pyz <verb> --home HOME [...]``.

A verb is declared in protocol.COMMANDS (its name, whether it takes ``--job``, its help); here it
gets its extra arguments (ARGUMENTS) and its handler (HANDLERS), which returns the exit code.

Every verb runs under umask 077: the home, job directories and files are the runner user's alone
(a spec holds secret values until its job starts; the output may print them).  Agents, job
runners and jobs start from a minimal environment (cluster_env.base_env), never the caller's: the
caller is a server worker or an SSH session whose variables (SECRET_KEY, DATABASE_URL) are not the
job's.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from . import commands
from .agent import Agent
from .files import Paths, emit
from .forward import cmd_forward
from .job import run_job
from .protocol import COMMANDS
from .shell import cmd_shell

DEFAULT_LOG_LIMIT = 1024 * 1024


def non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def _agent_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--poll", type=float, default=0.2)


def _ensure_agent_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--revive", action="store_true", help="start it even in a retired home")


def _log_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--offset", type=non_negative, default=0)
    parser.add_argument("--limit", type=non_negative, default=DEFAULT_LOG_LIMIT)
    parser.add_argument("--times", action="store_true", help="framed with output.times (runner/log_times.py)")


def _forward_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--to", required=True)
    parser.add_argument("--ports", required=True)
    parser.add_argument("--keys", default="", help="the authorized_keys file holding the grant's line")
    parser.add_argument("--grant", default="", help="the line's marker: gone means revoked")


def _shell_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--keys", default="", help="the authorized_keys file holding the grant's line")
    parser.add_argument("--grant", default="", help="the line's marker: gone means revoked")
    parser.add_argument("--command-file", default="", help="the command's file under HOME/shell-commands")


ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {
    "agent": _agent_arguments,
    "forward": _forward_arguments,
    "shell": _shell_arguments,
    "ensure-agent": _ensure_agent_arguments,
    "log": _log_arguments,
}

HANDLERS: dict[str, Callable[[Paths, Any], int]] = {
    "agent": lambda paths, args: Agent(paths, args.poll).run(),
    "ensure-agent": lambda paths, args: commands.cmd_ensure_agent(paths, args.revive),
    "status": lambda paths, args: commands.cmd_status(paths),
    "submit": lambda paths, args: commands.cmd_submit(paths, args.job),
    "stop": lambda paths, args: commands.cmd_stop(paths, args.job),
    "log": lambda paths, args: commands.cmd_log(paths, args.job, args.offset, args.limit, args.times),
    "cleanup": lambda paths, args: commands.cmd_cleanup(paths, args.job),
    "job": lambda paths, args: run_job(paths.home, args.job),
    "forward": lambda paths, args: cmd_forward(args.to, args.ports, args.keys, args.grant),
    "shell": lambda paths, args: cmd_shell(paths, args.job, args.keys, args.grant, args.command_file),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="muster_runner.pyz", description="Muster runner agent")
    sub = parser.add_subparsers(dest="command")
    sub.required = True
    for name, (needs_job, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text)
        command.add_argument("--home", required=True)
        if needs_job:
            command.add_argument("--job", required=True)
        if name in ARGUMENTS:
            ARGUMENTS[name](command)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.umask(0o077)
    args = build_parser().parse_args(argv)
    paths = Paths(args.home)
    try:
        return HANDLERS[args.command](paths, args)
    except ValueError as e:
        emit({"error": str(e)})
        return 2
