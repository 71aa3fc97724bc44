"""`python -m bench.peer.profile`: where the time of one plan and one apply goes on Muster.

One warm-up plan and apply first (imports, the URL resolver, the parser's caches), then plans and
applies through Django's test client in this process: 20 timed, 20 under cProfile (the figures
are per request) with the statements of the last one from Django's CaptureQueriesContext, on the bench's PostgreSQL database with a hollow fleet of 16 hosts. Prints
the statements with their time and the top functions by own and cumulative time.
"""

from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time

from bench import harness

REPS = 20  # requests under one profile, so one slow moment of the shared machine weighs 1/20


def profile_one(client, path: str, body: str, headers: dict) -> dict:
    from django.db import close_old_connections, connection
    from django.test.utils import CaptureQueriesContext

    plain, cpu = [], []
    for _ in range(REPS):  # wall time and this process's CPU time, without the profiler's overhead
        close_old_connections()  # what a WSGI request's start does (the test client skips it)
        t, c = time.perf_counter(), time.process_time()
        client.post(path, data=body, content_type="application/json", **headers)
        plain.append((time.perf_counter() - t) * 1000)
        cpu.append((time.process_time() - c) * 1000)
    prof = cProfile.Profile()
    for _ in range(REPS):
        with CaptureQueriesContext(connection) as queries:
            prof.enable()
            resp = client.post(path, data=body, content_type="application/json", **headers)
            prof.disable()
    ms = statistics.median(plain)
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(12)
    # the project's own functions (not the venv's), by cumulative time: which step costs what
    stats.sort_stats("cumulative").print_stats(rf"{harness.ROOT}/(?!\.venv)", 25)
    return {"status": resp.status_code, "ms": ms, "cpu_ms": statistics.median(cpu),
            "statements": [(q["time"], q["sql"][:160]) for q in queries], "profile": out.getvalue(),
            "buckets": buckets(stats)}


# (label, file suffix, function): cumulative seconds of each, the usual suspects of a request
BUCKETS = [
    ("whole request", "django/core/handlers/base.py", "get_response"),
    ("token auth (DRF authenticate)", "rest_framework/request.py", "_authenticate"),
    ("SQL (Django execute, psycopg round trips)", "django/db/backends/utils.py", "_execute_with_wrappers"),
    ("configuration parse + expand (parse_for_project)", "runs/services/submission.py", "parse_for_project"),
    ("  of it: YAML load", "runs/configuration/documents.py", "load_document"),
    ("job specs built (stored_dict)", "runs/configuration/expansion.py", "stored_dict"),
    ("configuration dumped (model_dump_json)", "pydantic/main.py", "model_dump_json"),
    ("plan: placement check", "runs/services/submission.py", "plan_capacity"),
    ("plan_run", "runs/services/submission.py", "plan_run"),
    ("submit_run", "runs/services/submission.py", "submit_run"),
    ("answer: serializer data", "rest_framework/serializers.py", "data"),
    ("answer: JSON render", "rest_framework/renderers.py", "render"),
]


def buckets(stats: pstats.Stats) -> dict[str, float]:
    out: dict[str, float] = {}
    for (filename, _line, func), (_cc, _nc, _tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        for label, suffix, name in BUCKETS:
            if func == name and filename.endswith(suffix):
                out[label] = max(out.get(label, 0.0), ct * 1000 / REPS)
    return out


def main() -> int:
    # BENCH_PROFILE_DB: another name, so two sessions on one machine do not drop each other's database
    session = harness.Session(db_name=os.environ.get("BENCH_PROFILE_DB", "muster_bench_profile"))
    try:
        session.setup()
        from django.test import Client

        from bench.hollow import make_hollow_fleet
        from bench.scenarios.common import project_with_user, task_yaml

        project, _, token = project_with_user("profile")
        make_hollow_fleet(project, "hollow", 16)
        from django.conf import settings
        from django.test.utils import override_settings

        # without the bench's statement counter (its Redis round trip per request is not the product's)
        override_settings(MIDDLEWARE=[m for m in settings.MIDDLEWARE if not m.startswith("bench.")]).enable()
        client = Client()
        headers = {"HTTP_AUTHORIZATION": f"Token {token}", "HTTP_ACCEPT": "application/json"}
        body = json.dumps({"configuration": task_yaml(4), "env": {}})
        base = f"/api/projects/{project.name}/"
        for path in ("runs/plan", "runs/"):
            client.post(base + path, data=body, content_type="application/json", **headers)
        for label, path in (("plan", "runs/plan"), ("apply", "runs/")):
            got = profile_one(client, base + path, body, headers)
            print(f"\n===== {label}: HTTP {got['status']}, median {got['ms']:.1f} ms in-process "
                  f"({got['cpu_ms']:.1f} ms of this process's CPU: the wait for PostgreSQL is the rest) over {REPS} "
                  f"(load average {open('/proc/loadavg').read().split()[0]}); {len(got['statements'])} statements "
                  f"each; per request under cProfile:")
            for secs, sql in got["statements"]:
                print(f"  {float(secs) * 1000:6.2f} ms  {sql}")
            for label, ms in sorted(got["buckets"].items(), key=lambda kv: -kv[1]):
                print(f"  {ms:7.1f} ms  {label}")
            print(got["profile"])
    finally:
        session.teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
