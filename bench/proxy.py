"""The services endpoint beside a direct connection and nginx, in front of the same replica.

    .venv/bin/python -m bench.proxy                 # every row (about two minutes)
    .venv/bin/python -m bench.proxy --seconds 5     # shorter rows
    .venv/bin/python -m bench.proxy --endpoints 2   # two endpoint processes on one port (SO_REUSEPORT)

Three ways to one replica (an aiohttp server, a process of its own): direct, nginx (Debian's,
started here on a free port with its own configuration: upstream keepalive, no buffering) and the
endpoint (`python -m django serve_endpoint` on a temporary embedded database holding one service
with `auth: false`, and one with `auth: true` for the token row). Measured:

- requests/s at a fixed concurrency (ApacheBench, keep-alive) of a small JSON answer;
- latency at a fixed rate (an asyncio client sending 200 requests/s on kept connections):
  p50/p99, and what each proxy adds over direct;
- the first chunk of a server-sent-event stream: from the replica's write (its timestamp in the
  event) to the client's read, p50/p99 over many streams.

Everything shares this machine's CPUs (the load average is printed with the figures). Not run in
CI; the figures and the aims are in docs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from bench.soak import ROOT, free_port

REPLICA = textwrap.dedent("""
    import asyncio, sys, time
    from aiohttp import web
    BODY = b'{"id":"cmpl-1","object":"text_completion","choices":[{"text":"hello","index":0}]}'
    async def small(request):
        return web.Response(body=BODY, content_type="application/json")
    async def sse(request):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(3):
            await response.write(f"data: {time.time():.6f}\\n\\n".encode())
            await asyncio.sleep(0.005)
        await response.write_eof()
        return response
    app = web.Application()
    app.router.add_get("/small", small)
    app.router.add_get("/sse", sse)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
""")

NGINX = """
worker_processes {workers};
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    upstream replica {{ server 127.0.0.1:{replica}; keepalive 64; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://replica;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
    client_body_temp_path {dir}/body; proxy_temp_path {dir}/proxy; fastcgi_temp_path {dir}/fcgi;
    uwsgi_temp_path {dir}/uwsgi; scgi_temp_path {dir}/scgi;
}}
"""

SETUP = textwrap.dedent("""
    import django; django.setup()
    from django.core.management import call_command
    call_command("migrate", verbosity=0)
    from projects.models import Project, Membership
    from django.contrib.auth import get_user_model
    from instances.models import Instance
    from runs.models import Run, Job
    from django.utils import timezone
    from projects.services.tokens import issue
    import sys
    port = int(sys.argv[1])
    project = Project.objects.create(name="bench")
    user = get_user_model().objects.create_user(username="bench")
    Membership.objects.create(project=project, user=user, role="user")
    host = Instance.objects.create(project=project, name="replica", backend="local", status="busy", hostname="127.0.0.1")
    for name, auth in (("open", False), ("closed", True)):
        conf = {"type": "service", "port": port, "auth": auth, "groups": [{"name": "0", "replicas": {"min": 1, "max": 1}}]}
        run = Run.objects.create(project=project, name=name, configuration=conf, status="running")
        Job.objects.create(run=run, job_num=0, node_group_name="0", spec={}, status="running", instance=host,
                           ready_at=timezone.now())
    print(issue(user)[1])
""")


def _wait_port(port: int, timeout: float = 60) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


def ab(url: str, concurrency: int, seconds: float, headers: dict | None = None) -> float:
    args = ["ab", "-k", "-q", "-c", str(concurrency), "-t", str(seconds), "-n", "10000000"]
    for k, v in (headers or {}).items():
        args += ["-H", f"{k}: {v}"]
    out = subprocess.run([*args, url], capture_output=True, text=True, timeout=seconds + 60).stdout
    failed = int(re.search(r"Failed requests:\s+(\d+)", out).group(1))
    non2xx = re.search(r"Non-2xx responses:\s+(\d+)", out)
    if failed or non2xx:
        raise RuntimeError(f"ab saw failures at {url}:\n{out}")
    return float(re.search(r"Requests per second:\s+([\d.]+)", out).group(1))


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


async def at_rate(url: str, rate: float, seconds: float, headers: dict | None = None) -> list[float]:
    import aiohttp

    latencies: list[float] = []
    async with aiohttp.ClientSession(headers=headers, connector=aiohttp.TCPConnector(limit=64)) as session:
        async def one():
            started = time.perf_counter()
            async with session.get(url) as response:
                await response.read()
                assert response.status == 200, response.status
            latencies.append(time.perf_counter() - started)

        tasks = []
        start = time.perf_counter()
        for i in range(int(rate * seconds)):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one()))
        await asyncio.gather(*tasks)
    return latencies[int(len(latencies) * 0.05):]  # the first connections' set-up is not the steady state


async def first_chunks(url: str, streams: int) -> list[float]:
    import aiohttp

    delays = []
    async with aiohttp.ClientSession() as session:
        for _ in range(streams):
            async with session.get(url) as response:
                line = await response.content.readline()
                delays.append(time.time() - float(line.split()[1]))
                await response.read()
    return delays[5:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.proxy")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--endpoints", type=int, default=1)
    args = parser.parse_args(argv)
    if not shutil.which("nginx") or not shutil.which("ab"):
        print("bench.proxy needs nginx and ab (apt-get install -y nginx apache2-utils)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="muster-bench-proxy-"))
    procs: list[subprocess.Popen] = []
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env.update(MUSTER_DATA_DIR=str(work / "data"), DJANGO_SETTINGS_MODULE="muster.settings", PYTHONUNBUFFERED="1")
    try:
        replica = free_port()
        procs.append(subprocess.Popen([sys.executable, "-c", REPLICA, str(replica)], start_new_session=True))
        token = subprocess.run([sys.executable, "-c", SETUP, str(replica)], cwd=ROOT, env=env, capture_output=True,
                               text=True, check=True).stdout.strip().splitlines()[-1]
        endpoint = free_port()
        for _ in range(args.endpoints):
            procs.append(subprocess.Popen([sys.executable, "-m", "django", "serve_endpoint", "--bind",
                                           f"127.0.0.1:{endpoint}"], cwd=ROOT, env=env, start_new_session=True,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        nginx_port = free_port()
        (work / "nginx.conf").write_text(NGINX.format(workers=os.cpu_count() or 1, dir=work, replica=replica,
                                                      port=nginx_port))
        procs.append(subprocess.Popen(["nginx", "-c", str(work / "nginx.conf"), "-p", str(work), "-g", "daemon off;"],
                                      start_new_session=True, stderr=subprocess.DEVNULL))
        for port in (replica, endpoint, nginx_port):
            _wait_port(port)
        ways = {"direct": f"http://127.0.0.1:{replica}",
                "nginx": f"http://127.0.0.1:{nginx_port}",
                "endpoint": f"http://127.0.0.1:{endpoint}/proxy/services/bench/open",
                "endpoint, auth": f"http://127.0.0.1:{endpoint}/proxy/services/bench/closed"}
        auth = {"Authorization": f"Bearer {token}"}
        for base in ways.values():  # warm: the table read, the token's check, the kept connections
            ab(f"{base}/small", 4, 1, auth)
        print(f"bench.proxy: {os.cpu_count()} CPUs, load average before {os.getloadavg()[0]:.2f}; "
              f"{args.endpoints} endpoint process(es), nginx {os.cpu_count()} workers", flush=True)
        rows = {}
        for name, base in ways.items():
            rps = ab(f"{base}/small", args.concurrency, args.seconds, auth)
            lat = asyncio.run(at_rate(f"{base}/small", args.rate, args.seconds, auth))
            first = asyncio.run(first_chunks(f"{base}/sse", args.streams)) if "auth" not in name else []
            rows[name] = (rps, _pct(lat, 50), _pct(lat, 99), first)
        direct = rows["direct"]
        print(f"{'way':16} {'req/s (c=' + str(args.concurrency) + ')':>14} {'p50 ms':>8} {'p99 ms':>8} "
              f"{'+p50 ms':>8} {'+p99 ms':>8} {'SSE 1st p50 ms':>15} {'p99 ms':>8}")
        for name, (rps, p50, p99, first) in rows.items():
            sse = f"{_pct(first, 50) * 1e3:15.2f} {_pct(first, 99) * 1e3:8.2f}" if first else f"{'':15} {'':8}"
            print(f"{name:16} {rps:14.0f} {p50 * 1e3:8.2f} {p99 * 1e3:8.2f} {(p50 - direct[1]) * 1e3:8.2f} "
                  f"{(p99 - direct[2]) * 1e3:8.2f} {sse}")
        print(f"endpoint / nginx requests/s: {rows['endpoint'][0] / rows['nginx'][0]:.0%}; "
              f"load average after {os.getloadavg()[0]:.2f}")
        return 0
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
