"""Jobs with `image` run in containers on SSH hosts with Docker, end to end: real dockerd per host
(in the host's network namespace), a local registry, a real Celery worker and the real runner."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from events.models import Event
from runs.services import logs
from runs.services.submission import submit_run
from tests.containers.docker_env import needs_docker, private_registry
from tests.engine.helpers import Beat, wait_for_run
from tests.ssh_e2e.helpers import fleet_configuration, registered_fleet
from tests.waiting import job_states, wait_until

pytestmark = [*needs_docker, pytest.mark.django_db(transaction=True)]

ENV_DUMP = """env | grep -E '^(DSTACK|TPU)_' | sort | sed 's/^/ENV /'
        echo "MARKER $(cat /etc/test-image-marker)"
        ip -4 -o addr show eth0 | sed 's/^/ADDR /'
        sed 's/^/HOSTFILE /' "$DSTACK_MPI_HOSTFILE"
"""

# The seed's PD shape (examples/pd-disagg.yml) with a router image and a worker image: the workers
# serve a file with busybox httpd on their own address, the router fetches from both (with nc: the
# static busybox's wget crashes in these images).
PD_RUN = """
type: task
name: pd-containers
fleets: [pd]
startup_order: workers-first
stop_criteria: master-done
groups:
  - name: router
    nodes: 1
    image: __ROUTER__
    resources: {cpu: 1}
    commands:
      - |
        __ENV_DUMP__
      - |
        for role in prefill decode; do
          if [ $role = prefill ]; then ip=${{ groups[1].nodes[0].IP_ADDRESS }}; else ip=${{ groups[2].nodes[0].IP_ADDRESS }}; fi
          for i in $(seq 100); do
            out=$(printf 'GET /role.txt HTTP/1.0\\r\\n\\r\\n' | nc $ip 8000 2>/dev/null | tail -n 1)
            [ -n "$out" ] && break
            sleep 0.2
          done
          echo "router got from $role at $ip:8000: $out"
          [ -n "$out" ]
        done
  - name: prefill
    nodes: 1
    image: __WORKER__
    resources: {gpu: "L40S:2"}
    commands:
      - |
        __ENV_DUMP__
      - echo "prefill worker $DSTACK_NODE_RANK at $DSTACK_NODE_IP" > role.txt
      - httpd -f -p $DSTACK_NODE_IP:8000 -h .
  - name: decode
    nodes: 1
    image: __WORKER__
    resources: {gpu: "L40S:2"}
    commands:
      - |
        __ENV_DUMP__
      - echo "decode worker $DSTACK_NODE_RANK at $DSTACK_NODE_IP" > role.txt
      - httpd -f -p $DSTACK_NODE_IP:8000 -h .
""".replace("__ENV_DUMP__", ENV_DUMP.strip())


@pytest.fixture
def project(api, fast_limits):
    from projects.models import Project

    return Project.objects.get(name="main")


@pytest.fixture
def fleet(docker_cluster, project):
    return registered_fleet(project, {"configuration": fleet_configuration(docker_cluster.pool)}, actor="test")


@pytest.fixture
def beat(celery_worker):
    with Beat() as beat:
        yield beat


@pytest.fixture(scope="module")
def images(docker_cluster):
    return {"router": docker_cluster.push("router", "router-image"),
            "worker": docker_cluster.push("worker", "worker-image")}


def lines(log: str, prefix: str) -> list[str]:
    return [line[len(prefix):] for line in log.splitlines() if line.startswith(prefix)]


def env_of(log: str) -> dict[str, str]:
    return dict(entry.split("=", 1) for entry in lines(log, "ENV ") if "=" in entry)


def test_pd_groups_run_in_their_own_images_and_leave_no_container(docker_cluster, images, fleet, project, beat):
    text = PD_RUN.replace("__ROUTER__", images["router"]).replace("__WORKER__", images["worker"])
    run = wait_for_run(submit_run(project, None, {"configuration": text}).name, timeout=120)
    assert run.status == "done", (job_states(run), [logs.read(j)[-600:].decode() for j in run.current_jobs()])
    jobs = list(run.current_jobs().select_related("instance"))
    ips = [j.instance.internal_ip for j in jobs]
    for job, marker in zip(jobs, ["router-image", "worker-image", "worker-image"], strict=True):
        log = logs.read(job).decode()
        assert lines(log, "MARKER ") == [marker], log
        assert f"inet {job.instance.internal_ip}/" in " ".join(lines(log, "ADDR ")), log
        env = env_of(log)
        assert env["DSTACK_NODE_RANK"] == str(job.job_num)
        assert env["DSTACK_MASTER_NODE_IP"] == ips[0]
        assert env["DSTACK_GPUS_NUM"] == "4"
        assert lines(log, "HOSTFILE ") == [ips[0], f"{ips[1]} slots=2", f"{ips[2]} slots=2"]
    router_log = logs.read(jobs[0]).decode()
    assert f"router got from prefill at {ips[1]}:8000: prefill worker 1 at {ips[1]}" in router_log
    assert f"router got from decode at {ips[2]}:8000: decode worker 2 at {ips[2]}" in router_log
    wait_until(lambda: docker_cluster.leftover_containers() == {}, timeout=30,
               what=f"no container left: {docker_cluster.leftover_containers()}")


RUNS = "/api/projects/main/runs/"

SLEEPER = """
type: task
name: __NAME__
fleets: [pd]
image: __IMAGE__
env:
  - TOKEN
commands:
  - echo "started with a token of ${#TOKEN} characters"
  - sleep 300
"""


def post_run(api, text: str) -> dict:
    resp = api.post(RUNS, {"configuration": text}, format="json")
    assert resp.status_code == 201, resp.content
    return resp.json()


def run_jobs(name: str):
    from runs.models import Run

    return list(Run.objects.get(project__name="main", name=name).current_jobs().select_related("instance"))


def host_of(docker_cluster, job):
    return next(h for h in docker_cluster.pool if h.address == job.instance.internal_ip)


def test_a_stopped_run_leaves_no_container_and_the_secret_is_in_no_argv_or_file(
        docker_cluster, images, fleet, api, beat):
    secret = "s3cret-value-for-the-container-test"
    resp = api.post("/api/projects/main/secrets/", {"name": "TOKEN", "value": secret}, format="json")
    assert resp.status_code == 201, resp.content
    post_run(api, SLEEPER.replace("__NAME__", "sleeper").replace("__IMAGE__", images["worker"]))
    wait_until(lambda: run_jobs("sleeper")[0].status == "running", 60, "the job running")
    job = run_jobs("sleeper")[0]
    host = host_of(docker_cluster, job)
    wait_until(lambda: str(job.uuid) in host.docker("ps", "--format", "{{.Names}}").stdout, 30,
               "the job's container, named by the job, running")
    wait_until(lambda: f"started with a token of {len(secret)} characters" in logs.read(job).decode(), 30,
               "the container to print its start line into the job's log")

    # The value reached the container, but no process on the host carries it in its arguments and
    # no file of the job keeps it.
    for pid in host.pids():
        try:
            assert secret.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes(), pid
        except FileNotFoundError:
            pass
    job_dir = host.muster_home / "jobs" / str(job.uuid)
    for path in job_dir.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    assert not (job_dir / "container.env").exists()

    resp = api.post(f"{RUNS}sleeper/stop", {"abort": False}, format="json")
    assert resp.status_code in (200, 202), resp.content
    wait_until(lambda: wait_for_run("sleeper", timeout=30).status == "terminated", 40, "the run terminated")
    wait_until(lambda: docker_cluster.leftover_containers() == {}, 30,
               "no container left after the stop (grace period, then removed)")


def test_a_failing_command_fails_the_job_with_container_exited_with_error(docker_cluster, images, fleet, project,
                                                                          beat):
    text = """
type: task
name: exits
fleets: [pd]
image: __IMAGE__
commands:
  - test -f /etc/test-image-marker
  - exit 7
""".replace("__IMAGE__", images["worker"])
    run = wait_for_run(submit_run(project, None, {"configuration": text}).name, timeout=60)
    assert run.status == "failed", job_states(run)
    job = run.current_jobs().get()
    assert (job.termination_reason, job.exit_status) == ("container_exited_with_error", 7), job_states(run)
    assert docker_cluster.leftover_containers() == {}


def test_a_missing_image_fails_with_the_registrys_message_within_the_pull_timeout(
        docker_cluster, fleet, project, beat, settings):
    settings.MUSTER = {**settings.MUSTER, "IMAGE_PULL_TIMEOUT": 20}
    text = """
type: task
name: missing
fleets: [pd]
image: __IMAGE__
commands:
  - echo never
""".replace("__IMAGE__", docker_cluster.image("no-such-image:1"))
    run = wait_for_run(submit_run(project, None, {"configuration": text}).name, timeout=60)
    assert run.status == "failed", job_states(run)
    job = run.current_jobs().get()
    assert job.termination_reason == "creating_container_error", job_states(run)
    assert "no-such-image" in job.termination_message and "not found" in job.termination_message, \
        job.termination_message
    assert job.start_time is None, "a job whose image never arrived never ran"
    assert docker_cluster.leftover_containers() == {}


def pull_events(job) -> list[str]:
    messages = Event.objects.filter(job_id=job.pk, status="pulling").order_by("pk").values_list("message", flat=True)
    return [m for m in messages if m.startswith(("pulling ", "pulled "))]


def test_the_job_is_pulling_while_its_image_is_pulled_and_a_present_image_is_not_pulled_again(
        docker_cluster, fleet, project, beat):
    ref = docker_cluster.push("pulled-once", "pulled-once")
    text = """
type: task
name: __NAME__
fleets: [pd]
image: __IMAGE__
resources: {cpu: 1}
commands:
  - cat /etc/test-image-marker
""".replace("__IMAGE__", ref)
    first = wait_for_run(submit_run(project, None, {"configuration": text.replace("__NAME__", "pull-1")}).name,
                         timeout=60)
    assert first.status == "done", job_states(first)
    job = first.current_jobs().get()
    pulls = pull_events(job)
    assert pulls and pulls[-1] == f"pulled {ref}: 1/1 layers", pulls

    # Every host has the image now: the next job finds it there and pulls nothing.
    for host in docker_cluster.pool:
        host.docker("pull", ref, timeout=120)
    second = wait_for_run(submit_run(project, None, {"configuration": text.replace("__NAME__", "pull-2")}).name,
                          timeout=60)
    assert second.status == "done", job_states(second)
    job2 = second.current_jobs().get()
    assert pull_events(job2) == []
    assert "pulled-once" in logs.read(job2).decode()
    docker_cluster.forget(ref)


def test_an_image_job_goes_only_to_hosts_with_docker_and_otherwise_says_so(ssh_hosts, docker_cluster, api,
                                                                           fast_limits):
    from instances.models import Instance

    plain = ssh_hosts(2, mode="netns")  # hosts without Docker
    fleet = registered_fleet(main_project(), {"configuration": fleet_configuration(plain, name="pd-disagg")},
                        actor="test")
    assert all(i.resources["docker"] is None for i in Instance.objects.filter(fleet=fleet))
    text = """
type: task
name: needs-docker
fleets: [pd-disagg]
image: __IMAGE__
commands: [echo hi]
""".replace("__IMAGE__", docker_cluster.image("worker"))
    resp = api.post(f"{RUNS}plan", {"configuration": text}, format="json")
    assert resp.status_code == 200, resp.content
    body = resp.json()["capacity"]
    assert body["fits"] is False
    assert "fleet pd-disagg: no host has Docker; install docker or remove image" in " ".join(body["reasons"]), body
    # The same job without an image runs on those hosts as before.
    resp = api.post(f"{RUNS}plan", {"configuration": text.replace("image: ", "# image: ")}, format="json")
    assert resp.json()["capacity"]["fits"] is True, resp.json()

    with_docker = registered_fleet(main_project(), {"configuration": fleet_configuration(docker_cluster.pool)},
                              actor="test")
    docker = [i.resources["docker"] for i in Instance.objects.filter(fleet=with_docker)]
    assert all(d and d["version"] and "runc" in d["runtimes"] for d in docker), docker
    resp = api.post(f"{RUNS}plan", {"configuration": text.replace("[pd-disagg]", "[pd-disagg, pd]")},
                    format="json")
    assert resp.json()["capacity"] == {"fits": True, "fleet": "pd", "reasons": [],
                                       "fleets": {"default": "pd"},
                                       "hosts": {"default": ["pd-0", "pd-1", "pd-2"]}}, resp.json()


def main_project():
    from projects.models import Project

    return Project.objects.get(name="main")


def test_a_container_the_runtime_cannot_start_fails_with_creating_container_error(docker_cluster, images, fleet,
                                                                                 project, beat):
    text = """
type: task
name: no-user
fleets: [pd]
image: __IMAGE__
user: nosuchuser
commands: [echo never]
""".replace("__IMAGE__", images["worker"])
    run = wait_for_run(submit_run(project, None, {"configuration": text}).name, timeout=60)
    job = run.current_jobs().get()
    assert (run.status, job.termination_reason) == ("failed", "creating_container_error"), job_states(run)
    assert "nosuchuser" in job.termination_message, job.termination_message
    assert docker_cluster.leftover_containers() == {}


PRIVATE = """
type: task
name: __NAME__
fleets: [pd]
image: __IMAGE__
resources: {cpu: 1}
commands:
  - cat /etc/test-image-marker
"""


def test_a_private_image_fails_clearly_without_registry_auth_and_pulls_with_it(docker_cluster, fleet, api, beat):
    password = "pw-of-the-private-registry"
    registry = private_registry(docker_cluster, password)
    ref = docker_cluster.push_private(registry, "private:1", "private-image")
    text = PRIVATE.replace("__IMAGE__", ref)

    post_run(api, text.replace("__NAME__", "no-auth"))
    run = wait_for_run("no-auth", timeout=60)
    job = run.current_jobs().get()
    assert (run.status, job.termination_reason) == ("failed", "creating_container_error"), job_states(run)
    assert "no basic auth credentials" in job.termination_message or "unauthorized" in job.termination_message, \
        job.termination_message

    with_auth = text.replace("commands:", f"registry_auth:\n  username: tester\n  password: {password}\ncommands:")
    plan = api.post(f"{RUNS}plan", {"configuration": with_auth.replace("__NAME__", "with-auth")}, format="json")
    assert "registry_auth" not in {w["field"] for w in plan.json()["warnings"]}, plan.json()["warnings"]
    shown = post_run(api, with_auth.replace("__NAME__", "with-auth"))
    assert password not in str(shown), "the password is never shown"
    run = wait_for_run("with-auth", timeout=60)
    job = run.current_jobs().select_related("instance").get()
    assert run.status == "done", job_states(run)
    assert "private-image" in logs.read(job).decode()
    host = host_of(docker_cluster, job)
    # Used for the pull only: nothing of it stays on the host (the hosts share the machine's disk).
    for path in host.muster_home.rglob("*"):
        if path.is_file():
            assert password.encode() not in path.read_bytes(), path
    for config in [Path.home() / ".docker" / "config.json", host.home / ".docker" / "config.json"]:
        assert not config.exists() or password.encode() not in config.read_bytes()
    assert not list(Path(tempfile.gettempdir()).glob("muster-pull-*"))
    docker_cluster.forget(ref)


def test_max_duration_and_a_fleet_delete_stop_the_containers_and_remove_them(docker_cluster, images, fleet, api,
                                                                             project, beat):
    from tests.ssh_e2e.helpers import deleted_fleet

    timed = SLEEPER.replace("__NAME__", "timed").replace("__IMAGE__", images["worker"]).replace(
        "env:\n  - TOKEN\n", "max_duration: 3s\n")
    run = wait_for_run(submit_run(project, None, {"configuration": timed}).name, timeout=60)
    job = run.current_jobs().get()
    assert job.termination_reason == "max_duration_exceeded", job_states(run)
    wait_until(lambda: docker_cluster.leftover_containers() == {}, 30, "no container left after max_duration")

    forever = SLEEPER.replace("__NAME__", "forever").replace("__IMAGE__", images["worker"]).replace(
        "env:\n  - TOKEN\n", "nodes: 3\n")
    run = submit_run(project, None, {"configuration": forever})
    wait_until(lambda: sum(len(h.containers()) for h in docker_cluster.pool) == 3, 60, "three containers running")
    deleted_fleet(fleet, force=True, actor="test")
    assert wait_for_run(run.name, timeout=60).status == "terminated"
    wait_until(lambda: docker_cluster.leftover_containers() == {}, 30, "no container left after the fleet delete")
