"""`muster fleet apply|list|delete` (and `muster apply` of a fleet): submit, wait for the SSH
hosts' registration, show."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from cli import deadlines, render
from cli.client import Client, CliError, format_error
from cli.files import inline_identity_files, read_document
from cli.follow import say, segment
from cli.prompts import client_for, confirm


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
    if deadlines.fleet_deadline(fleet):
        print(deadlines.fleet_deadline(fleet))
    if fleet.get("status") == "failed":
        for error in fleet.get("errors") or []:
            say(f"error: {format_error(error)}")
        return 1
    return 0


FLEET_WAIT_SECONDS = 900.0
POLL_SECONDS = 1.0


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
            raise CliError(f"fleet {name} is still registering after {timeout:g} s (the server goes on "
                           f"trying); see `muster fleet list`, or delete it with `muster fleet delete {name}`")
        time.sleep(poll)
        fleet = client.get(f"fleets/{segment(name)}/")




def cmd_fleet_apply(args: argparse.Namespace) -> int:
    text, doc = read_document(args.file)
    if doc.get("type", "fleet") != "fleet":
        raise CliError(f"{args.file}: type is {doc.get('type')!r}, not fleet: use `muster apply -f`")
    return submit_fleet(client_for(args), args.file, text, doc)


def cmd_fleet_list(args: argparse.Namespace) -> int:
    fleets = client_for(args).get("fleets/")
    print(render.fleets_table(fleets) if fleets else "No fleets.")
    return 0


def cmd_fleet_delete(args: argparse.Namespace) -> int:
    client = client_for(args)
    if not confirm(f"Delete fleet {args.name}{' (force)' if args.force else ''}?", args.yes):
        print("Not deleted.")
        return 0
    client.delete(f"fleets/{segment(args.name)}/", force="true" if args.force else None)
    print(f"Fleet {args.name}: deleting")
    wait_for_deletion(client, args.name)
    print(f"Fleet {args.name}: deleted")
    return 0


FLEET_DELETE_WAIT_SECONDS = 300.0


def wait_for_deletion(client: Client, name: str) -> None:
    """The server answers a delete at once and stops the hosts' runners in a step of its own:
    wait until the fleet is gone, as `muster fleet apply` waits for a registration."""
    timeout, poll = FLEET_DELETE_WAIT_SECONDS, POLL_SECONDS
    deadline = time.monotonic() + timeout
    while any(f.get("name") == name for f in client.get("fleets/")):
        if time.monotonic() > deadline:
            raise CliError(f"fleet {name} is still being deleted after {timeout:g} s (the server goes on "
                           "trying); see `muster fleet list`")
        time.sleep(poll)


def add_fleet_commands(subparsers: Any, command, add_yes) -> None:
    fleet = subparsers.add_parser("fleet", help="apply, list and delete fleets")
    actions = fleet.add_subparsers(dest="fleet_command", required=True, metavar="{apply,list,delete}")
    apply = command(actions, "apply", cmd_fleet_apply, help="create a fleet from a YAML file")
    apply.add_argument("-f", "--file", required=True)
    command(actions, "list", cmd_fleet_list, help="list fleets")
    delete = command(actions, "delete", cmd_fleet_delete, help="delete a fleet and its instances")
    delete.add_argument("name")
    delete.add_argument("--force", action="store_true", help="delete even if runs use it")
    add_yes(delete)
