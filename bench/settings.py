"""Settings for the benchmarks: the product's settings plus the hollow backend and bench knobs.

Used only via DJANGO_SETTINGS_MODULE=bench.settings by `python -m bench.run` / `bench.chaos` and the
worker, beat and web processes they start. The product's registry never names `hollow`; it is
reached through MUSTER["EXTRA_BACKENDS"], the hook deployments use for their own backends.
"""

from __future__ import annotations

import os

from muster.settings import *  # noqa: F401,F403
from muster.settings import MIDDLEWARE, MUSTER

# Like production (MUSTER_ENV=production): no DEBUG, so Django does not keep every query in memory.
DEBUG = False

MUSTER = {
    **MUSTER,
    "EXTRA_BACKENDS": {"hollow": "bench.hollow.HollowCompute", "hollow_tpu": "bench.hollow_tpu.HollowTpuCompute",
                       "hollow_tpu_q": "bench.hollow_tpu.HollowQueuedTpuCompute"},
    # how long a hollow job reports `running` after it was handed to the hollow runner
    "HOLLOW_RUN_SECONDS": float(os.environ.get("BENCH_HOLLOW_RUN_SECONDS", "2.0")),
    "JOB_POLL_INTERVAL": float(os.environ.get("BENCH_POLL_INTERVAL", "0.5")),
    # how long a job on a hollow TPU host runs (bench/hollow_tpu.py): a preemption must find it running
    "HOLLOW_TPU_RUN_SECONDS": float(os.environ.get("BENCH_HOLLOW_TPU_RUN_SECONDS", "20")),
    # the benches measure capacity, with one user for all their clients: no request rate unless asked
    "THROTTLE_USER": os.environ.get("MUSTER_THROTTLE_USER", ""),
}

# Query counting (bench/instrument.py): on only when a stats Redis is named.
BENCH_STATS_URL = os.environ.get("BENCH_STATS_URL", "")
if BENCH_STATS_URL:
    MIDDLEWARE = [*MIDDLEWARE, "bench.instrument.QueryCountMiddleware"]
    from bench import instrument as _instrument

    _instrument.connect_celery_signals()

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "WARNING")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}
