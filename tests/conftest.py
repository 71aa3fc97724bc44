"""Shared fixtures: API clients per role, a real Celery worker, short engine limits."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rest_framework.test import APIClient

pytest_plugins = ("celery.contrib.pytest",)

from tests.fake_tpu import fake_tpu  # noqa: E402,F401
from tests.local_processes import kill_everything_under  # noqa: E402
from tests.sshhosts import ssh_hosts, ssh_hosts_session  # noqa: E402,F401
from tests.waiting import patient  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def example(name: str) -> str:
    return (EXAMPLES / name).read_text()


def _local_first_address() -> str:
    """Where this test process's local instances start: a 127.A.B.x block of its own per run and
    xdist worker. Every test database starts its local fleets at the same index, and their jobs
    listen on fixed ports (examples/pd-disagg-local.yml: 8000), so two runs or two workers at the
    default 127.0.0.2 took each other's ports (a worker failed `Address already in use`)."""
    run = int(os.environ.get("MUSTER_TEST_RUN") or os.getpid())
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)
    n = (run * 16 + worker) % (250 * 256)
    return f"127.{1 + n // 256}.{n % 256}.2"


# Before Django reads its settings where it has not yet (and for the servers the tests start);
# _local_addresses below sets what was read already.
os.environ["MUSTER_LOCAL_FIRST_ADDRESS"] = _local_first_address()


@pytest.fixture(scope="session", autouse=True)
def _local_addresses():
    from django.conf import settings

    settings.MUSTER["LOCAL_FIRST_ADDRESS"] = os.environ["MUSTER_LOCAL_FIRST_ADDRESS"]


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the run's own process, before xdist starts its workers
        os.environ["MUSTER_TEST_RUN"] = str(os.getpid())
        from tests.test_databases import drop_databases_of_ended_runs

        drop_databases_of_ended_runs()


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):
        from tests.test_databases import drop_databases_of_this_run

        drop_databases_of_this_run()


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix):
    """A test database name of this run's own: test_muster_gw0_r<pid of the run's process>.

    Two checkouts testing at once on one PostgreSQL would otherwise both use test_muster_gw0, and
    each would drop the other's database at its start. The pid lets a later run drop the databases
    a killed run left (tests/test_databases.py).
    """
    from pytest_django.fixtures import _set_suffix_to_test_databases

    from tests.test_databases import run_suffix

    _set_suffix_to_test_databases(suffix=run_suffix())


@pytest.fixture(scope="session")
def celery_config():
    broker = os.environ.get("CELERY_BROKER_URL") or "memory://"
    return {
        "broker_url": broker,
        "result_backend": None,
        "task_ignore_result": True,
        "broker_connection_retry_on_startup": True,
        "task_default_queue": f"muster-test-{os.getpid()}",  # never steal a dev server's messages
    }


@pytest.fixture(scope="session", autouse=True)
def _test_broker(celery_config):
    """Point the project's Celery app at the test broker before anything sends a message.

    Producers cache their broker connection, so configuring the app later (when a test first asks
    for a worker) would leave earlier producers talking to another broker.
    """
    import engine.tasks  # noqa: F401
    from muster.celery import app

    app.conf.update(celery_config)
    return app


@pytest.fixture
def celery_app(_test_broker):
    """The project's own Celery app (its tasks registered), pointed at the test broker and queue."""
    return _test_broker


@pytest.fixture(scope="session")
def celery_worker_parameters():
    return {"queues": (f"muster-test-{os.getpid()}",), "perform_ping_check": False, "shutdown_timeout": 20}


@pytest.fixture
def celery_worker(celery_worker, settings):
    """The real worker, and what beat sends it besides the sweep: the batch watch of running jobs
    every JOB_POLL_INTERVAL (muster/celery.py). Tests that check recovery add the sweep (Beat)."""
    import threading

    from engine import tasks

    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(every := float(settings.MUSTER["JOB_POLL_INTERVAL"])):
            # expiring as beat's do (muster/celery.py): a tick the worker could not take in time is
            # dropped, not queued, or on a loaded machine ticks pile up ahead of every other task
            # (a finish_job waited 40 s behind them)
            tasks.watch_running.apply_async(expires=10 * every)

    thread = threading.Thread(target=tick, name="watch-ticks", daemon=True)
    thread.start()
    yield celery_worker
    stop.set()
    thread.join(5)


@pytest.fixture(scope="session")
def celery_enable_logging():
    return True


@pytest.fixture(autouse=True)
def _no_leases_carried_over():
    """A test's claims end with it: the lease renewer must not touch the next test's database."""
    yield
    from engine.claims import forget_all

    forget_all()


@pytest.fixture(autouse=True)
def _muster_dirs(tmp_path, settings):
    # LOCAL_FLEET_MEMBERS: most tests submit as a project admin to a local fleet a superuser made,
    # which the default (superusers' runs only) refuses; the tests of that rule set it back
    settings.MUSTER = {**settings.MUSTER, "LOG_DIR": tmp_path / "logs", "LOCAL_DIR": tmp_path / "local",
                       "LOCAL_FLEET_MEMBERS": True}
    yield
    # Any test may start local runner agents and job processes (a run on a local fleet, the
    # console's and the metrics' tests too); none may outlive it, passed or failed.
    kill_everything_under(tmp_path / "local")


def pytest_collection_modifyitems(config, items):
    """Each test's time limit (pytest-timeout) is the configured one times MUSTER_TEST_PATIENCE, as
    every wait is (tests/waiting.py); `-o timeout=0` (make fuzz) still lifts it."""
    limit = config.getoption("timeout", None)
    if limit is None:
        limit = float(config.getini("timeout") or 0)
    if not limit:
        return
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(patient(float(limit))))


@pytest.fixture
def fast_limits(settings):
    """Engine limits short enough for tests (production defaults are minutes)."""
    settings.MUSTER = {
        **settings.MUSTER,
        "SWEEP_INTERVAL": 0.5, "JOB_POLL_INTERVAL": 0.2, "LEASE_SECONDS": 10,
        # the waits a test does not time itself scale with the machine (tests/waiting.py): under two
        # suites at once a peer's runner start over SSH alone took longer than 30 s
        "WAITING_INSTANCE_LIMIT": patient(30), "WAITING_RUNNER_LIMIT": patient(15), "WAITING_PEERS_LIMIT": patient(30),
        "UNREACHABLE_GRACE": 3, "STOP_GRACE": 1, "RETRY_BACKOFF": [1, 1, 2], "WAITING_HOST_RECHECK": 2,
    }
    return settings.MUSTER


@pytest.fixture
def make_user(db, django_user_model):
    from projects.models import Membership, Project

    def make(username: str, project: str | None = "main", role: str = "admin"):
        user = django_user_model.objects.create_user(username=username)
        if project:
            proj, _ = Project.objects.get_or_create(name=project)
            Membership.objects.create(project=proj, user=user, role=role)
        return user

    return make


def token_for(user, lifetime_days: float | None = None) -> str:
    """A new API token for `user` (the key, as a client sends it); the only way tests make tokens."""
    from projects.services.tokens import issue

    return issue(user, lifetime_days)[1]


def client_for(user) -> APIClient:
    client = APIClient()
    if user is not None:
        client.credentials(HTTP_AUTHORIZATION=f"Token {token_for(user)}")
    return client


@pytest.fixture
def api(make_user):
    """An admin of project `main`."""
    return client_for(make_user("alice"))


@pytest.fixture
def superuser_api(db, django_user_model):
    """A superuser: the only caller that may create local fleets (projects.services.access.check_local_fleet)."""
    from projects.models import Membership, Project

    user = django_user_model.objects.create_superuser(username="root", password=None)
    proj, _ = Project.objects.get_or_create(name="main")
    Membership.objects.get_or_create(project=proj, user=user, defaults={"role": "admin"})
    return client_for(user)


@pytest.fixture
def project(api):
    from projects.models import Project

    return Project.objects.get(name="main")
