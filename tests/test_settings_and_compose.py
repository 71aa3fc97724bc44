"""Settings chosen by the environment (embedded default vs production), and the compose stack.

Settings are read once per process, so each case imports them in a fresh interpreter with an
environment built from scratch (nothing inherited from the shell that runs the tests).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.waiting import patient, wait_until

ROOT = Path(__file__).resolve().parent.parent
# what production needs set; each test leaves one out or adds to it
PROD = {"MUSTER_ENV": "production", "SECRET_KEY": "s3cret", "ALLOWED_HOSTS": "muster.example.com",
        "MUSTER_ENCRYPTION_KEYS": "a2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2s="}

SHOW_SETTINGS = """
import json
from muster import settings as s
db = s.DATABASES["default"]
print(json.dumps({
    "engine": db["ENGINE"], "options": db.get("OPTIONS", {}), "name": str(db.get("NAME")),
    "host": db.get("HOST"), "port": db.get("PORT"),
    "broker": s.CELERY_BROKER_URL, "transport": s.CELERY_BROKER_TRANSPORT_OPTIONS,
    "secret_key": s.SECRET_KEY, "debug": s.DEBUG, "data_dir": str(s.DATA_DIR),
    "encryption_keys": s.MUSTER_ENCRYPTION_KEYS,
}))
"""


def python(code: str, data_dir: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(data_dir.parent), "LANG": "C.UTF-8",
             "MUSTER_DATA_DIR": str(data_dir), "DJANGO_SETTINGS_MODULE": "muster.settings", **env}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=clean, capture_output=True, text=True,
                          timeout=120, check=False)


def settings_with(data_dir: Path, **env: str) -> dict:
    done = python(SHOW_SETTINGS, data_dir, **env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_with_nothing_set_it_uses_sqlite_in_wal_with_immediate_transactions(tmp_path):
    data = tmp_path / "data"
    conf = settings_with(data)
    assert conf["engine"] == "django.db.backends.sqlite3"
    assert conf["name"] == str(data / "muster.sqlite3")
    assert conf["options"]["transaction_mode"] == "IMMEDIATE"
    init = conf["options"]["init_command"].lower()
    assert "journal_mode=wal" in init
    assert "busy_timeout" in init
    assert conf["debug"] is False  # the technical 500 page only when asked for (docs/security.md)


def test_with_nothing_set_the_broker_is_the_filesystem_under_the_data_dir(tmp_path):
    data = tmp_path / "data"
    conf = settings_with(data)
    assert conf["broker"] == "filesystem://"
    transport = conf["transport"]
    for key in ("data_folder_in", "data_folder_out", "processed_folder"):
        folder = Path(transport[key])
        assert folder.is_relative_to(data), (key, folder)
        assert folder.is_dir(), f"{folder} is created at start"
    assert transport["data_folder_in"] == transport["data_folder_out"], "producers and consumers share one queue"


def test_the_embedded_broker_is_the_filesystem_transport_that_writes_messages_whole(tmp_path):
    # kombu's own filesystem transport lets a worker read a half-written message and die (kombu#1551)
    code = ("from muster.celery import app; t = type(app.connection_for_write().transport); "
            "print(t.__module__ + ':' + t.__name__)")
    done = python(code, tmp_path / "data")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "muster.broker:Transport"
    redis = python(code, tmp_path / "data", CELERY_BROKER_URL="redis://h:6379/0")
    assert redis.stdout.strip().splitlines()[-1] == "kombu.transport.redis:Transport"


def test_the_filesystem_broker_keeps_its_exchange_table_under_the_data_dir_too(tmp_path):
    data = tmp_path / "data"
    control = settings_with(data)["transport"].get("control_folder", "control")
    assert Path(control).is_absolute() and Path(control).is_relative_to(data), control


def test_a_secret_key_is_generated_once_in_the_data_dir_and_reused(tmp_path):
    data = tmp_path / "data"
    first = settings_with(data)["secret_key"]
    key_file = data / "secret_key"
    assert key_file.read_text().strip() == first
    assert len(first) >= 50
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600, "only the server's user can read it"
    assert settings_with(data)["secret_key"] == first, "sessions and tokens survive a restart"
    assert settings_with(tmp_path / "elsewhere")["secret_key"] != first


def test_a_secret_key_from_the_environment_wins_and_writes_no_file(tmp_path):
    data = tmp_path / "data"
    assert settings_with(data, SECRET_KEY="from-env")["secret_key"] == "from-env"
    assert not (data / "secret_key").exists()


def test_an_encryption_key_is_generated_once_in_the_data_dir_apart_from_the_secret_key(tmp_path):
    data = tmp_path / "data"
    first = settings_with(data)["encryption_keys"]
    key_file = data / "encryption_key"
    assert first == [key_file.read_text().strip()]
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    again = settings_with(data, SECRET_KEY="rotated")
    assert again["encryption_keys"] == first, "rotating SECRET_KEY keeps the encryption key"


def test_encryption_keys_from_the_environment_are_a_list_and_write_no_file(tmp_path):
    from cryptography.fernet import Fernet

    new, old = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    conf = settings_with(tmp_path / "data", MUSTER_ENCRYPTION_KEYS=f"{new}, {old}")
    assert conf["encryption_keys"] == [new, old]
    assert not (tmp_path / "data" / "encryption_key").exists()


def test_a_malformed_encryption_key_stops_start_up_saying_which(tmp_path):
    from cryptography.fernet import Fernet

    done = python(SHOW_SETTINGS, tmp_path / "data", MUSTER_ENCRYPTION_KEYS=f"{Fernet.generate_key().decode()},oops")
    assert done.returncode != 0
    assert "MUSTER_ENCRYPTION_KEYS: key 2 is not a Fernet key" in done.stderr


def test_production_without_encryption_keys_refuses_to_start(tmp_path):
    done = python(SHOW_SETTINGS, tmp_path / "data", **{**PROD, "MUSTER_ENCRYPTION_KEYS": ""})
    assert done.returncode != 0
    assert "MUSTER_ENCRYPTION_KEYS must be set" in done.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "data" / "encryption_key").exists()


def test_the_data_dir_and_every_file_in_it_are_private_from_creation(tmp_path):
    data = tmp_path / "data"
    # a permissive umask: the modes must come from how the files are created, not from the shell
    done = python("import os; os.umask(0o022); from muster import settings", data)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    for name in ("secret_key", "encryption_key", "muster.sqlite3"):
        assert stat.S_IMODE((data / name).stat().st_mode) == 0o600, name


def test_database_url_and_broker_url_switch_to_postgres_and_redis(tmp_path):
    conf = settings_with(tmp_path / "data", DATABASE_URL="postgres://u@h:5432/db",
                         CELERY_BROKER_URL="redis://h:6379/0")
    assert conf["engine"] == "muster.postgresql"  # Django's, subclassed (muster/postgresql)
    assert (conf["name"], conf["host"], conf["port"]) == ("db", "h", 5432)
    assert "transaction_mode" not in conf["options"]
    assert conf["broker"] == "redis://h:6379/0"
    assert "data_folder_in" not in conf["transport"]
    assert not (tmp_path / "data" / "broker").exists(), "no filesystem broker folders with redis"


def test_production_without_a_secret_key_refuses_to_start(tmp_path):
    data = tmp_path / "data"
    done = python(SHOW_SETTINGS, data, MUSTER_ENV="production", DATABASE_URL="postgres://u@h:5432/db",
                  CELERY_BROKER_URL="redis://h:6379/0")
    assert done.returncode != 0
    assert "ImproperlyConfigured" in done.stderr
    assert "SECRET_KEY" in done.stderr.strip().splitlines()[-1]
    assert not (data / "secret_key").exists(), "production never invents a key"


def test_production_with_a_secret_key_turns_debug_off(tmp_path):
    conf = settings_with(tmp_path / "data", **PROD)
    assert conf["secret_key"] == "s3cret"
    assert conf["debug"] is False


def test_the_sweep_and_watch_intervals_come_from_the_environment(tmp_path):
    code = ("import json; from muster.celery import app; "
            "print(json.dumps(app.conf.beat_schedule))")
    done = python(code, tmp_path / "data", MUSTER_SWEEP_INTERVAL="7", MUSTER_JOB_POLL_INTERVAL="1.5",
                  MUSTER_SCALING_INTERVAL="4", MUSTER_ROUTER_SYNC_INTERVAL="6")
    assert done.returncode == 0, done.stderr
    schedule = json.loads(done.stdout.strip().splitlines()[-1])
    assert {name: (e["schedule"], e["options"]["expires"]) for name, e in schedule.items()} == {
        "sweep": (7.0, 7.0), "watch": (1.5, 15.0), "logs": (3600.0, 3600.0),
        "pods": (7.5, 75.0), "scaling": (4.0, 4.0), "routers": (6.0, 6.0)}, \
        "the batch watch of running jobs ticks at the poll interval, live TPU pods at 5 times it, services' scaler " \
        "and PD services' router sweep at their own"


# ---- the beat schedule, in this process ---------------------------------------------------------


def test_every_beat_entry_names_a_registered_task_and_expires():
    from muster.celery import app

    app.loader.import_default_modules()  # what a worker does at start: autodiscover every tasks.py
    schedule = app.conf.beat_schedule
    assert schedule, "beat has something to do"
    for name, entry in schedule.items():
        assert entry["task"] in app.tasks, f"{name}: {entry['task']} is not a registered task"
        expires = entry.get("options", {}).get("expires")
        assert expires is not None and float(expires) > 0, f"{name}: a missed sweep must be dropped"
        # the sweep is dropped after one period; the watches (the only things that look at running
        # jobs and at live TPU pods) may wait out a short backlog, at most ten ticks of it
        limit = 10 if name in ("watch", "pods") else 1
        assert float(expires) <= limit * float(entry["schedule"]), f"{name}: ticks never pile up"


# ---- docker-compose.yml and the Dockerfile ---------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


APP_SERVICES = ("web", "worker", "beat", "endpoint")


def _command(service: dict) -> str:
    command = service.get("command", "")
    return " ".join(command) if isinstance(command, list) else command


def test_compose_has_the_production_services(compose):
    services = compose["services"]
    for name in ("postgres", "redis", *APP_SERVICES):
        assert name in services, name
    assert services["postgres"]["image"].startswith("postgres")
    assert services["redis"]["image"].startswith("redis")
    assert _command(services["web"]).startswith("gunicorn muster.wsgi")
    assert _command(services["worker"]).startswith("celery -A muster worker")
    assert _command(services["beat"]).startswith("celery -A muster beat")
    assert _command(services["endpoint"]).startswith("python manage.py serve_endpoint")


def test_compose_builds_every_app_service_from_one_image_and_the_dockerfile(compose):
    services = compose["services"]
    app = {name: s for name, s in services.items() if "build" in s}
    assert set(APP_SERVICES) <= set(app)
    assert len({json.dumps(s["build"], sort_keys=True) for s in app.values()}) == 1
    assert len({s.get("image") for s in app.values()}) == 1
    context = app["web"]["build"] if isinstance(app["web"]["build"], str) else app["web"]["build"]["context"]
    dockerfile = "Dockerfile" if isinstance(app["web"]["build"], str) else app["web"]["build"].get(
        "dockerfile", "Dockerfile")
    assert (ROOT / context / dockerfile).is_file()


def test_compose_points_the_app_at_its_postgres_and_redis_in_production_mode(compose):
    for name in APP_SERVICES:
        env = compose["services"][name]["environment"]
        assert env["DATABASE_URL"].startswith("postgres://") and "@postgres:" in env["DATABASE_URL"], name
        assert env["CELERY_BROKER_URL"].startswith("redis://redis:"), name
        assert env["MUSTER_ENV"] == "production", name
        assert "SECRET_KEY" in env, name
        assert "MUSTER_ENCRYPTION_KEYS" in env, name


def test_the_dockerfile_installs_muster_and_starts_gunicorn():
    text = (ROOT / "Dockerfile").read_text()
    assert text.startswith("FROM python:3.11")
    assert "pip install" in text
    assert "gunicorn" in text


def test_a_worker_started_with_muster_worker_nice_runs_at_that_niceness(tmp_path):
    data = tmp_path / "data"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "LANG": "C.UTF-8",
           "MUSTER_DATA_DIR": str(data), "DJANGO_SETTINGS_MODULE": "muster.settings", "MUSTER_WORKER_NICE": "7"}
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen([sys.executable, "-m", "celery", "-A", "muster", "worker", "--pool=solo",
                                   "--loglevel=INFO", "--without-gossip", "--without-mingle"],
                                  cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: " ready." in log.read_text(errors="replace") or worker.poll() is not None, timeout=60)
        assert worker.poll() is None, log.read_text()[-2000:]
        base = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, worker.pid) == min(19, base + 7)
    finally:
        worker.terminate()
        try:
            worker.wait(patient(20))  # a niced worker on a loaded machine is slow to finish
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(20)

LOCAL_BACKEND = """
import django
django.setup()
from django.conf import settings
print(settings.MUSTER["LOCAL_BACKEND"])
"""


def test_production_turns_the_local_backend_off(tmp_path):
    done = python(LOCAL_BACKEND, tmp_path / "data", **PROD)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
    assert "MUSTER_LOCAL_BACKEND" not in done.stderr


def test_an_operator_can_turn_it_back_on_in_production_with_a_warning_at_start_up(tmp_path):
    done = python(LOCAL_BACKEND, tmp_path / "data", **PROD, MUSTER_LOCAL_BACKEND="1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
    assert "MUSTER_LOCAL_BACKEND is on in production" in done.stderr


def test_the_embedded_default_keeps_the_local_backend(tmp_path):
    done = python(LOCAL_BACKEND, tmp_path / "data")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"


# ---- production hardening ---------------------------------------------------------------------------

STRONG = "k7#Qp2!vX9$wLm4@Zr8^Tn6&Yb3*Hc5(Jd1)Fg0-Ks_Pe+Ua=Oi~Wq"


def test_check_deploy_is_clean_in_production(tmp_path):
    done = subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"], cwd=ROOT,
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
                               "LANG": "C.UTF-8", "MUSTER_DATA_DIR": str(tmp_path / "data"),
                               **PROD, "SECRET_KEY": STRONG},
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout, done.stdout + done.stderr


def test_production_without_allowed_hosts_refuses_to_start_saying_so(tmp_path):
    done = python(SHOW_SETTINGS, tmp_path / "data", **{**PROD, "ALLOWED_HOSTS": ""})
    assert done.returncode != 0
    assert "ALLOWED_HOSTS must be set" in done.stderr.strip().splitlines()[-1]


def test_a_malformed_proxy_ssl_header_is_a_clear_start_up_error(tmp_path):
    done = python(SHOW_SETTINGS, tmp_path / "data", **PROD, MUSTER_PROXY_SSL_HEADER="HTTP_X_FORWARDED_PROTO")
    assert done.returncode != 0
    assert "MUSTER_PROXY_SSL_HEADER" in done.stderr.strip().splitlines()[-1]


SERVE_IN_PRODUCTION = """
import json
import django
django.setup()
from django.core.management import call_command
from django.contrib.auth import get_user_model
from django.test import Client
from projects.services.tokens import issue
call_command("migrate", verbosity=0)
key = issue(get_user_model().objects.create_user("ops"))[1]
host = {"HTTP_HOST": "muster.example.com"}
anon, proxied = Client(**host), Client(**host, HTTP_X_FORWARDED_PROTO="https")
out = {
    "schema_anon": anon.get("/api/schema/", secure=True).status_code,
    "docs_anon": anon.get("/api/docs/", secure=True).status_code,
    "schema_token": anon.get("/api/schema/", secure=True, HTTP_AUTHORIZATION="Token " + key).status_code,
    "http": anon.get("/api/projects/").status_code,
    "http_location": anon.get("/api/projects/").get("Location"),
    "healthz_http": anon.get("/healthz").status_code,
    "proxied": proxied.get("/api/projects/", HTTP_AUTHORIZATION="Token " + key).status_code,
    "hsts": anon.get("/api/projects/", secure=True).get("Strict-Transport-Security"),
}
print(json.dumps(out))
"""


def test_in_production_the_schema_is_for_signed_in_callers_and_plain_http_is_redirected(tmp_path):
    done = python(SERVE_IN_PRODUCTION, tmp_path / "data", **PROD, MUSTER_PROXY_SSL_HEADER="HTTP_X_FORWARDED_PROTO=https")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["schema_anon"] == 401 and out["docs_anon"] == 401, out
    assert out["schema_token"] == 200, out
    assert out["http"] == 301 and out["http_location"].startswith("https://muster.example.com/"), out
    assert out["healthz_http"] == 200, "probes inside the deployment are not redirected"
    assert out["proxied"] == 200, "a request the TLS proxy forwarded counts as secure"
    assert "max-age=" in (out["hsts"] or ""), out


def test_the_image_runs_as_a_user_that_is_not_root():
    lines = [line.split() for line in (ROOT / "Dockerfile").read_text().splitlines() if line.strip()]
    users = [words[1] for words in lines if words[0] == "USER"]
    assert users and users[-1] not in ("root", "0", "0:0"), users
    last_user = max(i for i, words in enumerate(lines) if words[0] == "USER")
    assert all(words[0] != "RUN" for words in lines[last_user:]), "nothing runs as root after USER"
