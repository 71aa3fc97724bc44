"""What a running job uses, from its host's runner to the user: a real worker, the local backend's
runner agents with an `nvidia-smi` on their PATH that prints the documented CSV, then `muster
metrics` and `muster ps` as their own processes, /metrics and the console's run page over HTTP."""

from __future__ import annotations

import html
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from instances.services.fleets import create_local_fleet
from runs import usage
from runs.models import Job
from tests.conftest import token_for
from tests.engine.helpers import wait_for_run
from tests.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

MUSTER = [sys.executable, "-c", "import sys; from cli.main import main; sys.exit(main())"]

# --query-gpu=index,utilization.gpu,memory.used,memory.total --format=csv,noheader,nounits, as a
# driver prints it for GPU 0, and as a broken or hostile host might for GPU 1 and after
NVIDIA_SMI = """#!/bin/sh
case "$*" in *index,utilization.gpu,memory.used,memory.total*noheader*nounits*) ;; *) exit 2 ;; esac
echo "0, 37, 1024, 16384"
echo "1, -5, [N/A], 99999999999999"
echo "not, a, gpu"
echo "-3, 50, 1, 2"
"""

# two nodes: their samples differ, and go back in one UPDATE of the watch batch (a CASE per job)
BUSY = "type: task\nname: busy\nnodes: 2\nresources: {cpu: 1.., memory: 1GB..}\ncommands:\n  - while :; do :; done\n"

# A job may write its own directory; what it puts in usage.json reaches the server as the runner's
# sample would: a time in 2286, a NaN, a negative CPU, absurd sizes, a string, junk GPUs. The
# runner's own sample replaces it every 5 s, for a second at least.
HOSTILE = """\
type: task
name: hostile
commands:
  - |
    while :; do
      printf '{"t": 9999999999, "cpu_percent": -12, "cpus": 1e9, "memory_bytes": 1e300, "memory_total_bytes": "lots",
        "gpus": [{"index": 0, "util_percent": NaN, "memory_used_bytes": -1, "memory_total_bytes": 1e30},
                 "junk", {"index": true}, {"index": 2, "util_percent": 1e9}]}' > ../usage.json.new
      mv ../usage.json.new ../usage.json
      sleep 1
    done
"""


@pytest.fixture
def gpu_host(monkeypatch, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(NVIDIA_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    # the runner agents start from the worker's environment (runner/cluster_env.py base_env)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


@pytest.fixture
def local_fleet(fast_limits, gpu_host):
    from projects.models import Project

    project, _ = Project.objects.get_or_create(name="main")
    fleet = create_local_fleet(project, "local", 2)
    yield fleet
    from engine.groups import terminate_fleet_instances

    terminate_fleet_instances(fleet)


@pytest.fixture
def alice(make_user):
    return make_user("alice")


@pytest.fixture
def muster(live_server, alice, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "MUSTER_URL": live_server.url, "MUSTER_TOKEN": token_for(alice),
           "MUSTER_PROJECT": "main"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*MUSTER, *args], env=env, capture_output=True, text=True, timeout=180,
                              cwd=Path(__file__).resolve().parents[2], stdin=subprocess.DEVNULL)

    return run


def _get(url: str, **headers: str) -> str:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=60) as answer:
        return answer.read().decode()


def _scrape(live_server, settings) -> dict[tuple, float]:
    settings.MUSTER = {**settings.MUSTER, "METRICS_TOKEN": "scrape-token"}
    text = _get(f"{live_server.url}/metrics", Authorization="Bearer scrape-token")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _console(live_server, user, path: str) -> str:
    browser = Client()
    browser.force_login(user)
    return html.unescape(_get(live_server.url + path, Cookie=f"sessionid={browser.cookies['sessionid'].value}"))


def _sample(name: str, ready) -> dict:
    def found():
        job = Job.objects.filter(run__name=name, job_num=0).first()
        last = usage.latest(job) if job is not None else None
        return last if last is not None and ready(last) else None

    return wait_until(found, timeout=60, what=f"a usage sample of {name}")


def test_a_busy_jobs_cpu_memory_and_gpus_reach_muster_metrics_prometheus_and_the_run_page(
        muster, local_fleet, celery_worker, live_server, settings, alice, tmp_path):
    (tmp_path / "busy.yml").write_text(BUSY)
    assert muster("apply", "-f", str(tmp_path / "busy.yml"), "-y", "-d").returncode == 0
    last = _sample("busy", lambda s: s["cpu_percent"] is not None)  # the second sample has a CPU figure
    wait_until(lambda: all(usage.latest(j) for j in Job.objects.filter(run__name="busy")), timeout=60,
               what="a sample of both nodes")
    assert last["cpu_percent"] > 0 and last["memory_bytes"] > 0 and last["cpus"] >= 1
    gib = 1 << 30
    assert last["gpus"] == [
        {"index": 0, "util_percent": 37.0, "memory_used_bytes": gib, "memory_total_bytes": 16 * gib},
        # -5 is clamped to 0, [N/A] is no figure, 99999999999999 MiB is clamped to 16 TiB
        {"index": 1, "util_percent": 0.0, "memory_used_bytes": None, "memory_total_bytes": usage.MAX_GPU_MEMORY},
    ]

    shown = muster("metrics", "busy")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == "run busy: running"
    assert lines[1].split() == ["JOB", "GROUP/RANK", "HOST", "STATUS", "CPU", "MEMORY", "GPUS", "SAMPLED"]
    assert lines[2].startswith("0 ") and " running " in lines[2] and "% of " in lines[2]
    assert "gpu0 37% 1.0GiB/16.0GiB, gpu1 0%" in lines[2]
    assert muster("metrics", "nope").returncode != 0

    ps = muster("ps").stdout.splitlines()
    assert ps[0].split() == ["NAME", "STATUS", "REASON", "FLEET", "JOBS", "CPU", "MEMORY", "SUBMITTED"]
    assert ps[1].split()[:7] == ["busy", "running", "-", "local", "2", "running", "2+"] and "2GB+" in ps[1]

    samples = _scrape(live_server, settings)
    key = (("job", "0"), ("project", "main"), ("run", "busy"))
    assert samples[("muster_job_cpu_percent", key)] > 0
    assert samples[("muster_job_memory_bytes", key)] > 0
    gpu0 = (("gpu", "0"), *key)
    assert samples[("muster_job_gpu_utilization_percent", gpu0)] == 37
    assert samples[("muster_job_gpu_memory_used_bytes", gpu0)] == gib

    page = _console(live_server, alice, "/projects/main/runs/busy/")
    row = page[page.index('<tr data-job="0">'):]
    row = row[:row.index("</tr>")]
    assert '<td class="cpu">' in row and "% of " in row
    assert "GPU 0: 37%, 1.0 GiB of 16.0 GiB; GPU 1: 0%" in row
    listed = _console(live_server, alice, "/")
    assert '<td class="cpu">2+</td>' in listed and '<td class="memory">2GB+</td>' in listed
    hosts = _console(live_server, alice, "/projects/main/fleets/")
    assert '<th scope="col">CPUs</th><th scope="col">Memory</th>' in hosts
    assert f'<td class="cpu">{os.cpu_count()}</td>' in hosts

    assert muster("stop", "busy", "-y").returncode == 0
    wait_for_run("busy", timeout=60)
    assert ("muster_job_cpu_percent", key) not in _scrape(live_server, settings)  # only running jobs


def test_what_a_hostile_host_reports_is_clamped_or_dropped_before_anyone_sees_it(
        muster, local_fleet, celery_worker, live_server, settings, alice, tmp_path):
    (tmp_path / "hostile.yml").write_text(HOSTILE)
    assert muster("apply", "-f", str(tmp_path / "hostile.yml"), "-y", "-d").returncode == 0
    last = _sample("hostile", lambda s: s["cpus"] == usage.MAX_CPUS)
    assert last == {"t": last["t"], "cpu_percent": 0.0, "cpus": usage.MAX_CPUS, "memory_bytes": usage.MAX_MEMORY,
                    "memory_total_bytes": None, "gpus": [
                        {"index": 0, "util_percent": None, "memory_used_bytes": 0,
                         "memory_total_bytes": usage.MAX_GPU_MEMORY},
                        {"index": 2, "util_percent": 100.0, "memory_used_bytes": None, "memory_total_bytes": None}]}
    assert last["t"] == usage.LATEST_TIME

    def real_after_hostile():
        kept = Job.objects.get(run__name="hostile").usage
        hostile = [i for i, s in enumerate(kept) if s["cpus"] == usage.MAX_CPUS]
        return any(s["cpus"] != usage.MAX_CPUS for s in kept[hostile[0]:]) if hostile else False

    # a sample dated far ahead does not stop the runner's own after it
    wait_until(real_after_hostile, timeout=60, what="the runner's sample kept after the hostile one")
    assert len(Job.objects.get(run__name="hostile").usage) <= usage.USAGE_KEEP
    scraped = _scrape(live_server, settings)
    assert all(value == value for value in scraped.values())  # no NaN reached Prometheus
    assert muster("metrics", "hostile").returncode == 0
    assert muster("stop", "hostile", "-y").returncode == 0
    wait_for_run("hostile", timeout=60)
