"""`make fuzz`: the property tests at 50x their suite size, then schemathesis against /api/schema/.

The configuration parser gets 100,000 examples, each plan-endpoint property 15,000. Then a
scratch Muster server (embedded default, own data directory) is fuzzed through its OpenAPI
schema with a valid token: every response must be a non-5xx, and every 400 must carry
errors[{loc, msg}] (checked by tests; schemathesis checks the status codes and the schema).
"""

from __future__ import annotations

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


# The two files run side by side, one per core. Hypothesis spends nearly all of the time drawing the
# nested documents (about 13 ms each here), not in the parser, so 100,000 examples take about 20 minutes
# and the suite's 300 s per-test limit is lifted for this run only.
PROPERTY_FILES = ["tests/configuration/test_fuzz.py", "tests/api/test_plan_fuzz.py"]


def property_tests() -> int:
    env = {**os.environ, "MUSTER_FUZZ_SCALE": os.environ.get("MUSTER_FUZZ_SCALE", "50")}
    print(f"fuzz: property tests at scale {env['MUSTER_FUZZ_SCALE']}, {len(PROPERTY_FILES)} files in parallel",
          flush=True)
    logs = Path(tempfile.mkdtemp(prefix="muster-fuzz-logs-"))
    started = time.monotonic()
    running = []
    for path in PROPERTY_FILES:
        log = logs / (Path(path).stem + ".log")
        cmd = [str(BIN / "pytest"), "-q", "-p", "no:cacheprovider", "-o", "timeout=0",
               "--hypothesis-show-statistics", path]
        with log.open("w") as out:
            running.append((path, log, subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out,
                                                        stderr=subprocess.STDOUT)))
    ended: dict[str, float] = {}
    while len(ended) < len(running):
        for path, _, proc in running:
            if path not in ended and proc.poll() is not None:
                ended[path] = time.monotonic() - started
        time.sleep(0.5)
    worst = 0
    for path, log, proc in running:
        code = proc.returncode
        worst = max(worst, code)
        print(f"fuzz: {path}: {'ok' if code == 0 else f'FAILED (exit {code})'} in {ended[path]:.0f} s; "
              f"full output in {log}")
        for line in log.read_text().splitlines():
            # hypothesis' statistics name each test and how many examples passed, failed or were invalid
            if line.endswith(":") and "::" in line or " passing, " in line:
                print("   ", line.strip())
        if code:
            print(log.read_text()[-4000:])
    return worst


def schemathesis(max_examples: int) -> int:
    if subprocess.run([str(BIN / "python"), "-c", "import schemathesis"], capture_output=True).returncode:
        subprocess.run([str(BIN / "pip"), "install", "-q", "schemathesis>=4,<5"], check=True)
    data = tempfile.mkdtemp(prefix="muster-fuzz-")
    env = {**os.environ, "MUSTER_DATA_DIR": data, "DJANGO_SETTINGS_MODULE": "muster.settings"}
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
        print(f"fuzz: schemathesis against http://{BIND}/api/schema/", flush=True)
        return subprocess.run([str(BIN / "schemathesis"), "run", f"http://{BIND}/api/schema/",
                               "-H", f"Authorization: Token {token}", "--checks", "not_a_server_error",
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
