"""A full data dir: `muster serve` on the embedded default (SQLite and the filesystem broker in
MUSTER_DATA_DIR) on a small tmpfs. While it is full, writes answer 507 with a message (JSON for
the API, a page for the console) and /healthz says why it is not OK; once space is back the same
server (no restart) takes runs again, its broker carries their messages and its worker keeps
their logs.
"""

from __future__ import annotations

import http.cookiejar
import json
import re
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from bench.soak import ServeProcess
from tests.waiting import wait_until

pytestmark = pytest.mark.slow
LINES = 100_000  # the job prints about 590 KB
EXPECTED = "".join(f"{i}\n" for i in range(1, LINES + 1))


@pytest.fixture
def small_data_dir(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m,mode=0700", "tmpfs", str(data)], check=True)
    yield data
    subprocess.run(["umount", str(data)], check=False)
    if data.is_mount():
        subprocess.run(["umount", "-l", str(data)], check=False)


@pytest.fixture
def served(small_data_dir, tmp_path):
    serve = ServeProcess(small_data_dir, concurrency=1)
    serve.log_path = tmp_path / "serve.log"  # kept off the disk that fills, to read what happened
    serve.start()
    # beat and the dstack gateway start once the web answers (muster/serve.py) and write their files
    # (the gateway its host key) as they start: the disk fills only once every child is up
    wait_until(lambda: len(serve.children()) == 5 and (small_data_dir / "dstack-gateway-host-key").exists(),
               timeout=60, what="every child of muster serve started")
    yield serve
    serve.stop()


def call(serve: ServeProcess, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    try:
        return 200, serve.api(method, path, body)
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw or b"null")
        except ValueError:
            return exc.code, {"not JSON": raw[:2000].decode(errors="replace")}


def healthz(serve: ServeProcess) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"{serve.url}/healthz", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def whole_log(serve: ServeProcess, run: str) -> str:
    text, start = "", 0
    while True:
        page = serve.api("GET", f"runs/{run}/logs?job=0&start={start}")
        if not page["text"]:
            return text
        text, start = text + page["text"], page["next"]


def run_to_done(serve: ServeProcess, name: str) -> None:
    conf = f"type: task\nname: {name}\ncommands: [seq {LINES}]\n"
    assert call(serve, "POST", "runs/", {"configuration": conf})[0] == 200
    wait_until(lambda: serve.status(name) in ("done", "failed", "terminated"), timeout=120, what=f"run {name} ends")
    assert serve.status(name) == "done"


def fill(data: Path) -> Path:
    filler = data / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * (1 << 16))
        except OSError as exc:
            assert exc.errno == 28, exc
    return filler


def console_login(serve: ServeProcess, data: Path) -> tuple[int, str]:
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    page = opener.open(f"{serve.url}/login/", timeout=10).read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    form = urllib.parse.urlencode({"csrfmiddlewaretoken": token, "username": "admin",
                                   "password": (data / "admin_password").read_text().strip()}).encode()
    req = urllib.request.Request(f"{serve.url}/login/", data=form, headers={"Referer": f"{serve.url}/login/"})
    try:
        with opener.open(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_a_full_data_dir_answers_507_says_so_on_healthz_and_the_server_recovers_when_space_is_back(served,
                                                                                                    small_data_dir):
    run_to_done(served, "before")
    assert whole_log(served, "before") == EXPECTED
    assert healthz(served) == (200, {"ok": True})

    filler = fill(small_data_dir)
    code, body = call(served, "POST", "runs/", {"configuration": "type: task\nname: full\ncommands: [echo hi]\n"})
    assert code == 507, body
    assert "disk is full" in body["errors"][0]["msg"] and "MUSTER_DATA_DIR" in body["errors"][0]["msg"]
    assert call(served, "GET", "runs/full/")[0] == 404, "nothing of the refused run is kept"
    code, page = console_login(served, small_data_dir)
    assert code == 507 and "<h1>The server's disk is full</h1>" in page, page[:3000]
    code, health = healthz(served)
    assert code == 503 and health["ok"] is False and "full" in health["reason"], health
    assert whole_log(served, "before") == EXPECTED, "what was kept can still be read"

    filler.unlink()
    wait_until(lambda: healthz(served) == (200, {"ok": True}), timeout=30, what="/healthz OK again")
    run_to_done(served, "after")  # through the same web, broker and worker: none was restarted
    assert whole_log(served, "after") == EXPECTED, "the worker keeps logs again"
    assert console_login(served, small_data_dir)[0] == 200
    assert "restarted" not in served.log(), served.log()[-6000:]
