"""Muster settings: an embedded default (SQLite + filesystem broker) and a production path.

With no environment set, everything lives under MUSTER_DATA_DIR (default `.muster-data/` in the
checkout): the SQLite database, the Celery filesystem broker, the generated SECRET_KEY, local
instance directories and stored logs. DATABASE_URL / CELERY_BROKER_URL switch to PostgreSQL / Redis.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from muster.env import data_dir, env_bool, env_float, env_int, env_str
from muster.files import private_dir
from muster.server_keys import encryption_keys, secret_key

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = data_dir()
private_dir(DATA_DIR)  # 0700: the database, keys and logs in it are the server user's alone
PRODUCTION = env_str("MUSTER_ENV") == "production"
SECRET_KEY = secret_key(PRODUCTION, DATA_DIR)
MUSTER_ENCRYPTION_KEYS = encryption_keys(PRODUCTION, DATA_DIR)
# Django's technical 500 page shows a failed request's variables: only when asked for (DEBUG=1), and
# even then only to a client on this machine (muster/debug.py)
DEBUG = env_bool("DEBUG", False)
DEFAULT_EXCEPTION_REPORTER = "muster.debug.LoopbackOnlyReporter"
DEFAULT_EXCEPTION_REPORTER_FILTER = "muster.debug.ReporterFilter"
ALLOWED_HOSTS = [h.strip() for h in env_str("ALLOWED_HOSTS", "" if PRODUCTION else "*").split(",") if h.strip()]
if PRODUCTION and not ALLOWED_HOSTS:
    raise ImproperlyConfigured("ALLOWED_HOSTS must be set when MUSTER_ENV=production: the host names clients use "
                               "to reach Muster, comma-separated (e.g. muster.example.com)")

if PRODUCTION:
    # HTTPS only (`manage.py check --deploy` is clean). Behind a proxy that terminates TLS, set
    # MUSTER_PROXY_SSL_HEADER (e.g. HTTP_X_FORWARDED_PROTO=https) so Django knows the request was secure.
    SECURE_SSL_REDIRECT = env_bool("MUSTER_SSL_REDIRECT", True)
    SECURE_REDIRECT_EXEMPT = [r"^healthz$"]  # probes from inside the deployment speak plain HTTP
    SECURE_HSTS_SECONDS = env_int("MUSTER_HSTS_SECONDS", 31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("MUSTER_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("MUSTER_HSTS_PRELOAD", True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    _proxy_header = env_str("MUSTER_PROXY_SSL_HEADER")
    if _proxy_header:
        name, _, value = _proxy_header.partition("=")
        if not name or not value:
            raise ImproperlyConfigured("MUSTER_PROXY_SSL_HEADER: write it as HEADER=value, e.g. "
                                       "HTTP_X_FORWARDED_PROTO=https")
        SECURE_PROXY_SSL_HEADER = (name.strip(), value.strip())
    CSRF_TRUSTED_ORIGINS = [o for o in env_str("CSRF_TRUSTED_ORIGINS").split(",") if o]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "projects",
    "instances",
    "runs",
    "events",
    "console",
    "dstack_api",
    "serving",
]
LOGIN_URL = "console:login"
LOGIN_REDIRECT_URL = "console:index"

MIDDLEWARE = [
    "muster.disk.DiskFullMiddleware",  # outermost: a full disk answers 507, whichever layer's write failed
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "console.security.ContentSecurityPolicyMiddleware",
]

ROOT_URLCONF = "muster.urls"
WSGI_APPLICATION = "muster.wsgi.application"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

# "login" holds the log-in failure counts, which every web process must see: a table in the database
# (made by `migrate`, projects/apps.py), or Redis with MUSTER_THROTTLE_LOGIN_CACHE=redis://...
# MAX_ENTRIES is high because a full table drops a third of its rows, and with them live locks.
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "login": ({"BACKEND": "django.core.cache.backends.redis.RedisCache",
               "LOCATION": env_str("MUSTER_THROTTLE_LOGIN_CACHE"), "KEY_PREFIX": "muster-login"}
              if env_str("MUSTER_THROTTLE_LOGIN_CACHE")
              else {"BACKEND": "django.core.cache.backends.db.DatabaseCache", "LOCATION": "muster_login_throttle",
                    "OPTIONS": {"MAX_ENTRIES": 1_000_000}}),
}

if env_str("DATABASE_URL"):
    DATABASES = {"default": dj_database_url.parse(env_str("DATABASE_URL"), conn_max_age=60, conn_health_checks=True)}
    if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
        # Django's, with no `SELECT 1` on a connection used cleanly within the last second
        DATABASES["default"]["ENGINE"] = "muster.postgresql"

else:
    SQLITE_PATH = DATA_DIR / "muster.sqlite3"
    if not SQLITE_PATH.exists():
        # created 0600 here, before SQLite would make it with the umask's mode; its -wal/-shm copy this mode
        os.close(os.open(SQLITE_PATH, os.O_WRONLY | os.O_CREAT, 0o600))
    # IMMEDIATE transactions take the write lock up front, so a read-then-conditional-update claim
    # never fails with "database is locked" on the read->write upgrade (see docs/how-it-works.md).
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(SQLITE_PATH),
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=20000;",
            },
            # A file, not the in-memory default: tests run a real Celery worker in other threads,
            # and shared-cache memory databases lock whole tables instead of waiting.
            "TEST": {"NAME": str(DATA_DIR / f"test-{os.getpid()}.sqlite3")},
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": f"django.contrib.auth.password_validation.{name}"}
    for name in ("UserAttributeSimilarityValidator", "MinimumLengthValidator", "CommonPasswordValidator",
                 "NumericPasswordValidator")
]
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"
STATIC_ROOT.mkdir(exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "projects.services.tokens.TokenAuthentication",  # hashed, expiring; same `Token <key>` header as DRF's
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "muster.schema.MusterAutoSchema",
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "EXCEPTION_HANDLER": "muster.api_errors.exception_handler",
    "DEFAULT_THROTTLE_CLASSES": ["muster.throttling.UserThrottle", "muster.throttling.AnonThrottle"],
    "DEFAULT_PARSER_CLASSES": [
        "muster.parsers.JSONParser",  # DRF's, with bounded nesting
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Muster API",
    "DESCRIPTION": "Runs, fleets, instances and TPU pods of a Muster control plane.",
    "VERSION": "0.1.0",
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # several tables have a `status`: each its own enum name (no W001 name collision in `check --deploy`)
    "ENUM_NAME_OVERRIDES": {
        "FleetStatusEnum": "instances.models.FleetStatus",
        "InstanceGroupStatusEnum": "instances.models.GroupStatus",
        "InstanceStatusEnum": "instances.models.InstanceStatus",
        "RunStatusEnum": "runs.choices.RunStatus",
        "JobStatusEnum": "runs.choices.JobStatus",
    },
    # the schema maps every endpoint: in production only signed-in callers (token or admin session) see it
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated" if PRODUCTION
                          else "rest_framework.permissions.AllowAny"],
}

# --- Celery (the CELERY_ namespace is read by muster/celery.py) ---
BROKER_DIR = DATA_DIR / "broker"
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "filesystem://")
if CELERY_BROKER_URL.startswith("filesystem://"):
    # kombu's filesystem transport with writes that never show a half-written message (muster/broker.py)
    CELERY_BROKER_TRANSPORT = "muster.broker:Transport"
    for sub in ("queue", "processed", "control"):
        (BROKER_DIR / sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR / "queue"),
        "data_folder_out": str(BROKER_DIR / "queue"),
        "processed_folder": str(BROKER_DIR / "processed"),
        "control_folder": str(BROKER_DIR / "control"),
        "store_processed": False,
        "polling_interval": 0.1,
    }
else:
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
CELERY_TASK_DEFAULT_QUEUE = env_str("CELERY_TASK_DEFAULT_QUEUE", "celery")
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_TIME_LIMIT = 300
CELERY_TASK_SOFT_TIME_LIMIT = 240
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_TIMEZONE = "UTC"
# the engine is not a Django app, so autodiscovery (each app's tasks.py) does not find its tasks
CELERY_IMPORTS = ("engine.tasks",)

def _cidrs(name: str, default: str = "") -> list[str]:
    items = [c.strip() for c in env_str(name, default).split(",") if c.strip()]
    for item in items:
        try:
            ipaddress.ip_network(item, strict=False)
        except ValueError as exc:
            raise ImproperlyConfigured(f"{name}: {item!r} is not a network (e.g. 10.0.0.0/8)") from exc
    return items


# --- Muster limits (seconds unless said otherwise); tests shorten them ---
MUSTER = {
    "MAX_NODES": env_int("MUSTER_MAX_NODES", 4096),
    # bytes of commands and env a run hands out over all its nodes (each node's runner gets a copy)
    "MAX_EXPANDED_BYTES": env_int("MUSTER_MAX_EXPANDED_BYTES", 256 << 20),
    "SWEEP_INTERVAL": env_float("MUSTER_SWEEP_INTERVAL", 2.0),
    "LEASE_SECONDS": env_float("MUSTER_LEASE_SECONDS", 15.0),  # renewed while held (engine/claims.py)
    # niceness of the Celery worker (0: as started); `muster serve` runs its worker at 10
    "WORKER_NICE": env_int("MUSTER_WORKER_NICE", 0),
    "JOB_POLL_INTERVAL": env_float("MUSTER_JOB_POLL_INTERVAL", 1.0),
    # seconds between looks at a TPU slice being created (0: 5 × JOB_POLL_INTERVAL; creation takes minutes)
    "POD_POLL_INTERVAL": env_float("MUSTER_POD_POLL_INTERVAL", 0.0),
    "WAITING_INSTANCE_LIMIT": env_float("MUSTER_WAITING_INSTANCE_LIMIT", 600.0),
    "WAITING_RUNNER_LIMIT": env_float("MUSTER_WAITING_RUNNER_LIMIT", 300.0),
    "WAITING_PEERS_LIMIT": env_float("MUSTER_WAITING_PEERS_LIMIT", 600.0),
    # seconds between the sweep's looks at a run waiting for a host of a full fleet (a freed host
    # wakes it at once; this catches a lost wake, a host added or one back from unreachable)
    "WAITING_HOST_RECHECK": env_float("MUSTER_WAITING_HOST_RECHECK", 60.0),
    "UNREACHABLE_GRACE": env_float("MUSTER_UNREACHABLE_GRACE", 30.0),
    # how long a TPU slice may stay UNHEALTHY_MAINTENANCE under a run before it counts as lost
    "TPU_MAINTENANCE_GRACE": env_float("MUSTER_TPU_MAINTENANCE_GRACE", 300.0),
    "STOP_GRACE": env_float("MUSTER_STOP_GRACE", 5.0),
    # seconds a job's image may take to pull before the job fails (creating_container_error)
    "IMAGE_PULL_TIMEOUT": env_float("MUSTER_IMAGE_PULL_TIMEOUT", 600.0),
    "RETRY_BACKOFF": [15, 30, 60, 120, 300, 600],
    # what one project may pile up (runs/limits.py; 0: no cap): runs not finished, runs
    # waiting for a host of a full fleet, and a run's retry.duration (how long it is retried or waits)
    "MAX_ACTIVE_RUNS_PER_PROJECT": env_int("MUSTER_MAX_ACTIVE_RUNS_PER_PROJECT", 5000),
    "MAX_WAITING_RUNS_PER_PROJECT": env_int("MUSTER_MAX_WAITING_RUNS_PER_PROJECT", 1000),
    "MAX_RETRY_DURATION": env_int("MUSTER_MAX_RETRY_DURATION", 7 * 86400),
    # the services' endpoint (serving/proxy/) as clients reach it: a service's URL is
    # <this>/proxy/services/<project>/<run>/; an https:// URL means a TLS proxy is in front of it
    "ENDPOINT_URL": env_str("MUSTER_ENDPOINT_URL", "http://127.0.0.1:8001"),
    # services (engine/replicas/): the scaler's sampling interval; how long a replica out of the pool runs
    # on so its requests finish (at most 10 min); beat's look at PD routers' worker lists (docs/services.md)
    "SCALING_INTERVAL": env_float("MUSTER_SCALING_INTERVAL", 10.0),
    "DRAIN_DELAY": env_float("MUSTER_DRAIN_DELAY", 5.0),
    "ROUTER_SYNC_INTERVAL": env_float("MUSTER_ROUTER_SYNC_INTERVAL", 10.0),
    "LOCAL_FLEET_SIZE": env_int("MUSTER_LOCAL_FLEET_SIZE", 4),
    # the loopback address of the first local instance (the next take the addresses after it):
    # `make demo` starts at 127.0.0.6, so it runs beside `make run` (127.0.0.2-5) on one machine
    "LOCAL_FIRST_ADDRESS": env_str("MUSTER_LOCAL_FIRST_ADDRESS", "127.0.0.2"),
    # local instances run jobs as the server's own user: off in production unless the operator opts in
    "LOCAL_BACKEND": env_bool("MUSTER_LOCAL_BACKEND", not PRODUCTION),
    "LOCAL_FLEET_MAX": env_int("MUSTER_LOCAL_FLEET_MAX", 16),
    # whose runs local fleets take: superusers' only, unless this opens them to every project writer
    "LOCAL_FLEET_MEMBERS": env_bool("MUSTER_LOCAL_FLEET_MEMBERS", False),
    "MAX_JSON_DEPTH": env_int("MUSTER_MAX_JSON_DEPTH", 64),  # levels of nesting a request body may have
    # requests per caller ("N/s", "N/min", "N/hour", "N/day"; empty: no limit). Generous: a CLI, the
    # benches and the tests stay far below; they stop a runaway script or a scan of anonymous calls.
    "THROTTLE_USER": env_str("MUSTER_THROTTLE_USER", "10000/min"),
    "THROTTLE_ANON": env_str("MUSTER_THROTTLE_ANON", "600/min"),
    # `muster serve`'s gunicorn: worker processes (0: from the CPU count, 2 to 4) and threads in each
    "WEB_WORKERS": env_int("MUSTER_WEB_WORKERS", 0),
    "WEB_THREADS": env_int("MUSTER_WEB_THREADS", 4),
    # password log-ins (/login/, /admin/login/, projects/services/login_throttle.py): after this many
    # failures of one user name (or from one client address) within WINDOW seconds of each other, tries
    # are refused with 429 before any password hashing for LOCK seconds, doubling per further failure
    "THROTTLE_LOGIN_FAILURES": env_int("MUSTER_THROTTLE_LOGIN_FAILURES", 5),
    "THROTTLE_LOGIN_ADDRESS_FAILURES": env_int("MUSTER_THROTTLE_LOGIN_ADDRESS_FAILURES", 20),
    "THROTTLE_LOGIN_WINDOW": env_float("MUSTER_THROTTLE_LOGIN_WINDOW", 900.0),
    "THROTTLE_LOGIN_LOCK": env_float("MUSTER_THROTTLE_LOGIN_LOCK", 60.0),
    "THROTTLE_LOGIN_LOCK_MAX": env_float("MUSTER_THROTTLE_LOGIN_LOCK_MAX", 3600.0),
    "TOKEN_LIFETIME_DAYS": env_float("MUSTER_TOKEN_LIFETIME_DAYS", 90.0),  # 0: tokens never expire
    "LOG_DIR": DATA_DIR / "logs",
    "LOG_COPY_LIMIT": env_int("MUSTER_LOG_COPY_LIMIT", 64 << 20),  # bytes of a finished job's log kept
    # bytes of a job's output.log the runner keeps on its host (for a local job: in MUSTER_DATA_DIR),
    # the last a line that says the rest was dropped; the job goes on (runner/output_log.py)
    "JOB_LOG_LIMIT": env_int("MUSTER_JOB_LOG_LIMIT", 64 << 20),
    # bytes of finished jobs' logs kept per project (0: no quota; a project's own log_quota wins):
    # the oldest finished runs' logs go first, and a copy that still does not fit is cut short
    "LOG_QUOTA": env_int("MUSTER_LOG_QUOTA", 4 << 30),
    # days a finished run's logs are kept (0: until the run is deleted); the sweep runs every LOG_SWEEP_INTERVAL
    "LOG_RETENTION_DAYS": env_float("MUSTER_LOG_RETENTION_DAYS", 30.0),
    "LOG_SWEEP_INTERVAL": env_float("MUSTER_LOG_SWEEP_INTERVAL", 3600.0),
    # bytes free under MUSTER_DATA_DIR below which /healthz says the data dir is full (muster/disk.py)
    "DATA_DIR_MIN_FREE": env_int("MUSTER_DATA_DIR_MIN_FREE", 16 << 20),
    "LOCAL_DIR": DATA_DIR / "local",
    # SSH fleet hosts the server may connect to (comma-separated CIDRs; deny wins, and applies to the
    # IPv4 address an IPv6 one embeds). Production denies the unspecified addresses, loopback and
    # link-local (cloud metadata at 169.254.169.254) unless MUSTER_SSH_HOSTS_DENY is set.
    "SSH_HOSTS_ALLOW": _cidrs("MUSTER_SSH_HOSTS_ALLOW"),
    "SSH_HOSTS_DENY": _cidrs("MUSTER_SSH_HOSTS_DENY",
                             "0.0.0.0/8,127.0.0.0/8,::/128,::1/128,169.254.0.0/16,fe80::/10" if PRODUCTION else ""),
    # refuse every address of the server's own interfaces (read at each connection), 0.0.0.0/8, ::
    # and loopback, whatever the deny list says; MUSTER_SSH_OWN_ADDRESSES_ALLOW names own addresses
    # (CIDRs) a fleet host may still have, e.g. a GPU host that also runs the control plane
    "SSH_DENY_OWN_ADDRESSES": env_bool("MUSTER_SSH_DENY_OWN_ADDRESSES", PRODUCTION),
    "SSH_OWN_ADDRESSES_ALLOW": _cidrs("MUSTER_SSH_OWN_ADDRESSES_ALLOW"),
    # seconds for one SSH connect or one command (short: the engine looks at a host once per poll, and
    # an unreachable host should cost one short wait), and for all of one host's registration
    # (connect, probe, upload, start the agent)
    "SSH_TIMEOUT": env_float("MUSTER_SSH_TIMEOUT", 10.0),
    "SSH_REGISTER_TIMEOUT": env_float("MUSTER_SSH_REGISTER_TIMEOUT", 60.0),
    # the sweep's health check of live SSH hosts (engine/ssh_health.py): seconds between looks at one
    # host, and for one look (a connect and one status command)
    "SSH_HEALTH_INTERVAL": env_float("MUSTER_SSH_HEALTH_INTERVAL", 10.0),
    "SSH_HEALTH_TIMEOUT": env_float("MUSTER_SSH_HEALTH_TIMEOUT", 5.0),
    "SSH_OUTPUT_LIMIT": env_int("MUSTER_SSH_OUTPUT_LIMIT", 4 << 20),  # bytes of stdout+stderr one command may print
    # seconds between Docker probes of one SSH host by the health check (instances/docker_facts.py)
    "SSH_DOCKER_PROBE_INTERVAL": env_float("MUSTER_SSH_DOCKER_PROBE_INTERVAL", 300.0),
    # seconds a pending SSH fleet is registered again (after unexpected errors) before it is failed
    "SSH_REGISTER_GIVE_UP": env_float("MUSTER_SSH_REGISTER_GIVE_UP", 600.0),
    # /metrics: scrapers send `Authorization: Bearer <token>`; with no token it answers 403 unless
    # the operator opens it (on a network only the scraper reaches) with MUSTER_METRICS_OPEN=1
    "METRICS_TOKEN": env_str("MUSTER_METRICS_TOKEN"),
    "METRICS_OPEN": env_bool("MUSTER_METRICS_OPEN", False),
    # how many projects /metrics names in its `project` label (the first made); the rest are `other`
    "METRICS_PROJECTS": env_int("MUSTER_METRICS_PROJECTS", 20),
    # where `muster attach` puts a user's key on an SSH host: the file the host's sshd reads for the
    # fleet user (its AuthorizedKeysFile); `~/` is that user's home
    "ATTACH_AUTHORIZED_KEYS": env_str("MUSTER_ATTACH_AUTHORIZED_KEYS") or "~/.ssh/authorized_keys",
    # the dstack CLI's SSH gateway: port, bind (`muster serve`: the web's host), where the CLI dials (empty:
    # the bound host and port) (docs/dstack-cli.md); its limits, each explained in docs/security.md
    "DSTACK_SSH_PORT": (_gateway_port := env_int("MUSTER_DSTACK_SSH_PORT", 2222)),
    "DSTACK_SSH_BIND": env_str("MUSTER_DSTACK_SSH_BIND", f"127.0.0.1:{_gateway_port}"),
    "DSTACK_SSH_AUTH_TIMEOUT": env_float("MUSTER_DSTACK_SSH_AUTH_TIMEOUT", 20.0),
    "DSTACK_SSH_MAX_CONNECTIONS": env_int("MUSTER_DSTACK_SSH_MAX_CONNECTIONS", 64),
    "DSTACK_SSH_MAX_PER_ADDRESS": env_int("MUSTER_DSTACK_SSH_MAX_PER_ADDRESS", 16),
    "DSTACK_SSH_MAX_PER_USER": env_int("MUSTER_DSTACK_SSH_MAX_PER_USER", 16),
    "DSTACK_SSH_MAX_CHANNELS": env_int("MUSTER_DSTACK_SSH_MAX_CHANNELS", 16),
    "DSTACK_SSH_MAX_LOG_STREAMS": env_int("MUSTER_DSTACK_SSH_MAX_LOG_STREAMS", 32),
    "DSTACK_SSH_RECHECK": env_float("MUSTER_DSTACK_SSH_RECHECK", 5.0),
    "DSTACK_SSH_PUBLIC_HOST": env_str("MUSTER_DSTACK_SSH_PUBLIC_HOST"),
    "DSTACK_SSH_PUBLIC_PORT": env_int("MUSTER_DSTACK_SSH_PUBLIC_PORT", 0),
    # the services endpoint (serving/proxy/, docs/services.md): where it listens (`muster serve`: on
    # the web's host, ENDPOINT_URL to match unless given), seconds to connect to a replica / of a
    # replica's silence / for a client's headers or of its silence mid-body, bytes of a request body
    # (and of a WebSocket message) / of one header line, headers per request; a scale-to-zero
    # service's wait for a replica, the routing table's re-read (the safety net under NOTIFY;
    # SQLite's only way), a token's cache, the peers (the TLS proxy's) whose X-Forwarded-* are believed
    "ENDPOINT_BIND": env_str("MUSTER_ENDPOINT_BIND", "127.0.0.1:8001"),
    "ENDPOINT_CONNECT_TIMEOUT": env_float("MUSTER_ENDPOINT_CONNECT_TIMEOUT", 5.0),
    "ENDPOINT_READ_TIMEOUT": env_float("MUSTER_ENDPOINT_READ_TIMEOUT", 300.0),
    "ENDPOINT_CLIENT_TIMEOUT": env_float("MUSTER_ENDPOINT_CLIENT_TIMEOUT", 30.0),
    "ENDPOINT_MAX_BODY": env_int("MUSTER_ENDPOINT_MAX_BODY", 64 << 20),
    "ENDPOINT_MAX_HEADER": env_int("MUSTER_ENDPOINT_MAX_HEADER", 8190),
    "ENDPOINT_MAX_HEADERS": env_int("MUSTER_ENDPOINT_MAX_HEADERS", 100),
    "ENDPOINT_COLD_START_WAIT": env_float("MUSTER_ENDPOINT_COLD_START_WAIT", 120.0),
    "ENDPOINT_ROUTES_REFRESH": env_float("MUSTER_ENDPOINT_ROUTES_REFRESH", 5.0),
    "ENDPOINT_AUTH_CACHE": env_float("MUSTER_ENDPOINT_AUTH_CACHE", 5.0),
    "ENDPOINT_TRUSTED_PROXIES": env_str("MUSTER_ENDPOINT_TRUSTED_PROXIES", "127.0.0.1/32,::1/128"),
    # set in a settings file, not the environment: the gcp backend's defaults (the MUSTER_GCP_*
    # variables win, backends/gcp/config.py), and backends a deployment adds (name -> dotted class path)
    "GCP": {},
    "EXTRA_BACKENDS": {},
}

LOGGING = {
    "version": 1, "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}}, "root": {"handlers": ["console"],
                                                                          "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}
