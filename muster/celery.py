"""The Celery app. Tasks live in each app's tasks.py; the beat schedule is static and in code."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "muster.settings")

app = Celery("muster")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def _beat_schedule() -> dict:
    from django.conf import settings

    every = float(settings.MUSTER["SWEEP_INTERVAL"])
    # `expires`: a sweep that could not run in its own period is dropped, never piled up.
    return {"sweep": {"task": "runs.tasks.sweep", "schedule": every, "options": {"expires": every}}}


app.conf.beat_schedule = _beat_schedule()
