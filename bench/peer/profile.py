"""`python -m bench.peer.profile`: where the time of one plan and one apply goes on Muster.

One warm-up plan and apply first (imports, the URL resolver, the parser's caches), then one plan and
one apply through Django's test client in this process, each under cProfile and Django's
CaptureQueriesContext, on the bench's PostgreSQL database with a hollow fleet of 16 hosts. Prints
the statements with their time and the top functions by own and cumulative time.
"""

from __future__ import annotations

import cProfile
import io
import json
import pstats
import sys
import time

from bench import harness


def profile_one(client, path: str, body: str, headers: dict) -> dict:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    prof = cProfile.Profile()
    with CaptureQueriesContext(connection) as queries:
        t = time.perf_counter()
        prof.enable()
        resp = client.post(path, data=body, content_type="application/json", **headers)
        prof.disable()
        ms = (time.perf_counter() - t) * 1000
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(15)
    stats.sort_stats("cumulative").print_stats(30)
    return {"status": resp.status_code, "ms": ms, "statements": [(q["time"], q["sql"][:160]) for q in queries],
            "profile": out.getvalue()}


def main() -> int:
    session = harness.Session(db_name="muster_bench_profile")
    try:
        session.setup()
        from django.test import Client

        from bench.hollow import make_hollow_fleet
        from bench.scenarios.common import project_with_user, task_yaml

        project, _, token = project_with_user("profile")
        make_hollow_fleet(project, "hollow", 16)
        client = Client()
        headers = {"HTTP_AUTHORIZATION": f"Token {token}", "HTTP_ACCEPT": "application/json"}
        body = json.dumps({"configuration": task_yaml(4), "env": {}})
        base = f"/api/projects/{project.name}/"
        for path in ("runs/plan", "runs/"):
            client.post(base + path, data=body, content_type="application/json", **headers)
        for label, path in (("plan", "runs/plan"), ("apply", "runs/")):
            got = profile_one(client, base + path, body, headers)
            print(f"\n===== {label}: HTTP {got['status']}, {got['ms']:.1f} ms in-process under cProfile, "
                  f"{len(got['statements'])} statements")
            for secs, sql in got["statements"]:
                print(f"  {float(secs) * 1000:6.2f} ms  {sql}")
            print(got["profile"])
    finally:
        session.teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
