"""memory: resident memory (RSS) of the web and worker processes, idle and after load.

Idle: a freshly started web (gunicorn master + workers, after one request) and worker (celery main
+ prefork children). After load: the worker after `place` at the largest H of this session, the web
after `submit`. Each figure is per process (max) and summed over the process tree.
"""

from __future__ import annotations

import time
import urllib.request

from bench import harness
from bench.scenarios.common import table


def run(session: harness.Session, args, context: dict) -> dict:
    w = session.start_worker("memprobe", args.concurrency)
    web, port = session.start_web(name="webprobe")
    urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).read()
    time.sleep(1)
    worker_idle = harness.tree_rss(w.pid)
    web_idle = harness.tree_rss(web.pid)
    session.stop("memprobe")
    session.stop("webprobe")
    place = context.get("place") or {}
    submit = context.get("submit") or {}
    rows = [["worker (fresh, idle)", worker_idle["processes"], worker_idle["max_mib"], worker_idle["sum_mib"]]]
    for i, rss in enumerate(place.get("worker_rss_after_largest") or []):
        H = place["sizes"][-1]["H"]
        rows.append([f"worker{i} after place H={H}", rss["processes"], rss["max_mib"], rss["sum_mib"]])
    rows.append(["web (fresh, idle)", web_idle["processes"], web_idle["max_mib"], web_idle["sum_mib"]])
    if submit.get("web_rss_after"):
        s = submit["web_rss_after"]
        rows.append(["web after submit", s["processes"], s["max_mib"], s["sum_mib"]])
    text = table("memory: RSS (MiB)", ["process", "processes", "max per process", "sum"], rows)
    return {"worker_idle": worker_idle, "worker_after_place": place.get("worker_rss_after_largest"),
            "web_idle": web_idle, "web_after_submit": submit.get("web_rss_after"), "table": text}
