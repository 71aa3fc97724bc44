"""How a command talks to its user besides its output: confirmations, the client it uses, and
argparse's usage errors with the closest command named."""

from __future__ import annotations

import argparse
import difflib
import re
import sys

from cli.client import Client, CliError, load_settings


def client_for(args: argparse.Namespace) -> Client:
    return Client(load_settings(args.project))


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


class Parser(argparse.ArgumentParser):
    """argparse, saying which command (or choice) a misspelt one is closest to."""

    def error(self, message: str):  # type: ignore[override]
        wrong = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if wrong:
            close = difflib.get_close_matches(wrong.group(1), re.findall(r"'([^']*)'", wrong.group(2)), n=1)
            if close:
                message += f"; did you mean `{close[0]}`?"
        super().error(message)
