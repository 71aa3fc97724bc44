from __future__ import annotations

from django.db import models


class Counter(models.Model):
    """A monotonic count (and seconds) that /metrics exposes: task outcomes and durations, sweep
    recoveries. Kept in the database because the workers that count are other processes, often on
    other machines, than the web process that is scraped (console/taskstats.py adds to it)."""

    name = models.CharField(max_length=64)  # "task", "sweep_recovery", "sweep_routine" or "claim_conflict"
    label = models.CharField(max_length=128)  # the task name or the sweep's kind of row
    outcome = models.CharField(max_length=32, blank=True, default="")
    count = models.BigIntegerField(default=0)
    seconds = models.FloatField(default=0.0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["name", "label", "outcome"], name="one_counter_per_labels")]
