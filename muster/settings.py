"""Muster settings: an embedded default (SQLite + filesystem broker) and a production path.

With no environment set, everything lives under MUSTER_DATA_DIR (default `.muster-data/` in the
checkout): the SQLite database, the Celery filesystem broker, the generated SECRET_KEY, local
instance directories and stored logs. DATABASE_URL / CELERY_BROKER_URL switch to PostgreSQL / Redis.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from muster.env import env_bool, env_float, env_int, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(env_str("MUSTER_DATA_DIR", str(BASE_DIR / ".muster-data"))).resolve()
DATA_DIR.mkdir(parents=True, exist_ok=True)
PRODUCTION = env_str("MUSTER_ENV") == "production"


def _secret_key() -> str:
    key = env_str("SECRET_KEY")
    if key:
        return key
    if PRODUCTION:
        raise ImproperlyConfigured("SECRET_KEY must be set in the environment when MUSTER_ENV=production")
    path = DATA_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = env_bool("DEBUG", not PRODUCTION)
ALLOWED_HOSTS = [h for h in env_str("ALLOWED_HOSTS", "*").split(",") if h]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "projects",
    "instances",
    "runs",
    "events",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
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

if env_str("DATABASE_URL"):
    DATABASES = {"default": dj_database_url.parse(env_str("DATABASE_URL"), conn_max_age=60, conn_health_checks=True)}
else:
    # IMMEDIATE transactions take the write lock up front, so a read-then-conditional-update claim
    # never fails with "database is locked" on the read->write upgrade (see docs/how-it-works.md).
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(DATA_DIR / "muster.sqlite3"),
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

AUTH_PASSWORD_VALIDATORS: list[dict] = []
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
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "EXCEPTION_HANDLER": "muster.api_errors.exception_handler",
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

# --- Muster limits (seconds unless said otherwise); tests shorten them ---
MUSTER = {
    "MAX_NODES": env_int("MUSTER_MAX_NODES", 4096),
    "SWEEP_INTERVAL": env_float("MUSTER_SWEEP_INTERVAL", 2.0),
    "LEASE_SECONDS": env_float("MUSTER_LEASE_SECONDS", 15.0),  # renewed while held (muster/claims.py)
    # niceness of the Celery worker (0: as started); `muster serve` runs its worker at 10
    "WORKER_NICE": env_int("MUSTER_WORKER_NICE", 0),
    "JOB_POLL_INTERVAL": env_float("MUSTER_JOB_POLL_INTERVAL", 1.0),
    "WAITING_INSTANCE_LIMIT": env_float("MUSTER_WAITING_INSTANCE_LIMIT", 600.0),
    "WAITING_RUNNER_LIMIT": env_float("MUSTER_WAITING_RUNNER_LIMIT", 300.0),
    "WAITING_PEERS_LIMIT": env_float("MUSTER_WAITING_PEERS_LIMIT", 600.0),
    "UNREACHABLE_GRACE": env_float("MUSTER_UNREACHABLE_GRACE", 30.0),
    "STOP_GRACE": env_float("MUSTER_STOP_GRACE", 5.0),
    "RETRY_BACKOFF": [15, 30, 60, 120, 300, 600],
    "LOCAL_FLEET_SIZE": env_int("MUSTER_LOCAL_FLEET_SIZE", 4),
    "LOG_DIR": DATA_DIR / "logs",
    "LOG_COPY_LIMIT": env_int("MUSTER_LOG_COPY_LIMIT", 64 << 20),  # bytes of a finished job's log kept
    "LOCAL_DIR": DATA_DIR / "local",
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}
