"""`make fuzz`: the property tests at 50x their suite size, then schemathesis against /api/schema/.

The configuration parser gets 100,000 documents (two halves of 50,000 with different seeds) and
10,000 each as YAML text and as raw text; each plan-endpoint property gets 15,000. Then a
scratch Muster server (embedded default, own data directory) is fuzzed through its OpenAPI
schema with a valid token: every response must be a non-5xx, and every 400 (or 415) must carry
errors[{loc, msg}] (scripts/fuzz_checks.py, a schemathesis check of our own).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
BIND = os.environ.get("MUSTER_FUZZ_BIND", "127.0.0.1:8766")


# Hypothesis spends nearly all of the time drawing the nested documents (about 13 ms each here), not
# in the parser, so the runs are spread over three processes on the two cores: the 100,000-example
# document property in two halves of 50,000 with different seeds, and everything else in a third.
# The suite's 300 s per-test limit is lifted for this run only.
DOCUMENTS = "tests/configuration/test_fuzz.py::test_random_documents_either_parse_or_raise_configuration_errors"
PROPERTY_RUNS = [  # (label, pytest arguments, share of the scale)
    ("parser documents, half 1", ["--hypothesis-seed=1", DOCUMENTS], 0.5),
    ("parser documents, half 2", ["--hypothesis-seed=2", DOCUMENTS], 0.5),
    ("parser text and YAML, plan endpoint", ["tests/configuration/test_fuzz.py", "--deselect", DOCUMENTS,
                                             "tests/api/test_plan_fuzz.py"], 1.0),
]


def property_tests() -> int:
    scale = float(os.environ.get("MUSTER_FUZZ_SCALE", "50"))
    print(f"fuzz: property tests at scale {scale:g}, {len(PROPERTY_RUNS)} processes", flush=True)
    logs = Path(tempfile.mkdtemp(prefix="muster-fuzz-logs-"))
    started = time.monotonic()
    running = []
    for i, (label, args, share) in enumerate(PROPERTY_RUNS):
        log = logs / f"run-{i}.log"
        cmd = [str(BIN / "pytest"), "-q", "-p", "no:cacheprovider", "-o", "timeout=0",
               "--hypothesis-show-statistics", *args]
        env = {**os.environ, "MUSTER_FUZZ_SCALE": str(scale * share)}
        with log.open("w") as out:
            running.append((label, log, subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out,
                                                         stderr=subprocess.STDOUT)))
    ended: dict[str, float] = {}
    while len(ended) < len(running):
        for label, _, proc in running:
            if label not in ended and proc.poll() is not None:
                ended[label] = time.monotonic() - started
        time.sleep(0.5)
    worst = 0
    for label, log, proc in running:
        code = proc.returncode
        worst = max(worst, code)
        print(f"fuzz: {label}: {'ok' if code == 0 else f'FAILED (exit {code})'} in {ended[label]:.0f} s; "
              f"full output in {log}")
        for line in log.read_text().splitlines():
            # hypothesis' statistics name each test and how many examples passed, failed or were invalid
            if line.endswith(":") and "::" in line or " passing, " in line:
                print("   ", line.strip())
        if code:
            print(log.read_text()[-4000:])
    return worst


def seed_objects(token: str) -> None:
    """A fleet and a run for the fuzzer's path parameters to find (scripts/fuzz_checks.py)."""
    bodies = {"fleets/": "type: fleet\nname: fuzz-local\nbackends: [local]\nnodes: 2\n",
              "runs/": "type: task\nname: fuzz-run\ncommands: [echo fuzz]\n"}
    for path, configuration in bodies.items():
        request = urllib.request.Request(
            f"http://{BIND}/api/projects/main/{path}", data=json.dumps({"configuration": configuration}).encode(),
            headers={"Authorization": f"Token {token}", "Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=30) as resp:
            assert resp.status == 201, (path, resp.status)


def schemathesis(max_examples: int) -> int:
    if subprocess.run([str(BIN / "python"), "-c", "import schemathesis"], capture_output=True).returncode:
        subprocess.run([str(BIN / "pip"), "install", "-q", "schemathesis>=4,<5"], check=True)
    data = tempfile.mkdtemp(prefix="muster-fuzz-")
    env = {**os.environ, "MUSTER_DATA_DIR": data, "DJANGO_SETTINGS_MODULE": "muster.settings",
           # scripts/fuzz_checks.py: every 400/415 body is errors[{loc, msg}]
           "SCHEMATHESIS_HOOKS": "fuzz_checks",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "scripts"), os.environ.get("PYTHONPATH")]))}
    for var in ("DATABASE_URL", "CELERY_BROKER_URL"):
        env.pop(var, None)
    manage = [str(BIN / "python"), str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "--noinput", "-v", "0"], env=env, check=True)
    subprocess.run([*manage, "muster_bootstrap"], env=env, check=True, capture_output=True)
    token = subprocess.run([*manage, "muster_token", "admin"], env=env, check=True, capture_output=True,
                           text=True).stdout.strip()
    web = subprocess.Popen([*manage, "runserver", BIND, "--noreload"], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://{BIND}/healthz", timeout=2)
                break
            except OSError:
                time.sleep(0.3)
        seed_objects(token)
        print(f"fuzz: schemathesis against http://{BIND}/api/schema/", flush=True)
        return subprocess.run([str(BIN / "schemathesis"), "run", f"http://{BIND}/api/schema/",
                               "-H", f"Authorization: Token {token}", "--checks", "not_a_server_error,rejections_locate_the_problem",
                               "--max-examples", str(max_examples)], env=env).returncode
    finally:
        web.terminate()
        web.wait(10)


def main() -> int:
    codes = {"property tests": property_tests(), "schemathesis": schemathesis(int(os.environ.get(
        "MUSTER_SCHEMATHESIS_EXAMPLES", "200")))}
    for name, code in codes.items():
        print(f"fuzz: {name}: {'ok' if code == 0 else f'FAILED (exit {code})'}")
    return max(codes.values())


if __name__ == "__main__":
    raise SystemExit(main())
