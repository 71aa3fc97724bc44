"""`muster attach` waits for the worker that installs its key (the server answered 202), as
`muster fleet apply` waits for a registration: until `installed`, with the reason it waits, and
gives up with a clear error on a withdrawn attach or after its timeout."""

from __future__ import annotations

import pytest

from cli import attach, follow
from cli.client import CliError

INSTALLING = {"id": 7, "job": 0, "status": "installing", "error": ""}


class Client:
    """Answers each GET of the attach with the next of `answers` (the last one again when done)."""

    def __init__(self, *answers: dict):
        self.answers, self.paths = list(answers), []

    def get(self, path: str) -> dict:
        self.paths.append(path)
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


@pytest.fixture(autouse=True)
def quick(monkeypatch):
    monkeypatch.setattr(follow, "POLL_SECONDS", 0.01)


def test_attach_polls_until_the_key_is_installed_and_says_why_it_waits(capsys):
    installed = {**INSTALLING, "status": "installed", "ssh": {"hostname": "10.0.0.5"}}
    silent = {**INSTALLING, "error": "host h-0 did not take the key: no route to host"}
    client = Client(silent, silent, installed)
    assert attach.wait_until_installed(client, "r 1", INSTALLING) == installed
    assert client.paths == ["runs/r%201/attach/7"] * 3
    assert capsys.readouterr().err.count("no route to host; the server tries again") == 1


def test_attach_whose_key_was_withdrawn_fails_with_the_servers_words():
    withdrawn = {"id": 7, "status": "withdrawn", "error": "the attach key was withdrawn before it was installed"}
    with pytest.raises(CliError, match="withdrawn before it was installed"):
        attach.wait_until_installed(Client(withdrawn), "r1", INSTALLING)


def test_attach_gives_up_after_its_timeout_saying_the_server_goes_on_trying():
    silent = {**INSTALLING, "error": "host h-0 did not take the key: timed out"}
    with pytest.raises(CliError, match=r"has not installed the attach key on job 0's host after 0.05 s "
                                       r"\(last try: host h-0 did not take the key: timed out\)"):
        attach.wait_until_installed(Client(silent), "r1", INSTALLING, timeout=0.05)
