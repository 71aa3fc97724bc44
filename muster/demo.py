"""`make demo`: start Muster on a scratch data directory, apply the local PD example, show it end.

The router, prefill and decode groups run on the local backend (127.0.0.x addresses); the router
starts last and prints what it fetched from both workers. Exits with the CLI's status: 0 on done.
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
BIND = os.environ.get("MUSTER_DEMO_BIND", "127.0.0.1:8765")


def _wait_until_up(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise SystemExit(f"demo: Muster did not come up at {url}")


def main() -> int:
    data = tempfile.mkdtemp(prefix="muster-demo-")
    env = {**os.environ, "MUSTER_DATA_DIR": data, "DJANGO_SETTINGS_MODULE": "muster.settings"}
    env.pop("DATABASE_URL", None)
    env.pop("CELERY_BROKER_URL", None)
    manage = [sys.executable, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "--noinput", "-v", "0"], env=env, check=True, cwd=ROOT)
    token = subprocess.run([*manage, "muster_token", "admin", "--project", "main"], env=env, check=True,
                           cwd=ROOT, capture_output=True, text=True).stdout.strip()
    server = subprocess.Popen([sys.executable, "-m", "cli", "serve", "--bind", BIND], env=env, cwd=ROOT,
                              start_new_session=True)
    url = f"http://{BIND}"
    try:
        _wait_until_up(url)
        print(f"demo: Muster is up at {url} (data in {data}); applying examples/pd-disagg-local.yml", flush=True)
        client_env = {**env, "MUSTER_URL": url, "MUSTER_TOKEN": token, "MUSTER_PROJECT": "main"}
        code = subprocess.run([sys.executable, "-m", "cli", "apply", "-f",
                               str(ROOT / "examples" / "pd-disagg-local.yml"), "-y"], env=client_env, cwd=ROOT).returncode
        subprocess.run([sys.executable, "-m", "cli", "ps", "-a"], env=client_env, cwd=ROOT)
        return code
    finally:
        os.killpg(server.pid, 15)
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, 9)


if __name__ == "__main__":
    raise SystemExit(main())
