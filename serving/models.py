from __future__ import annotations

from django.db import models


class ServiceStats(models.Model):
    """The endpoint's count of requests to one service, summed over every endpoint process.

    Each endpoint process adds what it counted since its last flush (one UPDATE ... + n, never a
    read-modify-write), so the total is exact however many processes serve; the scaler turns two
    samples of `requests` into requests per second (engine). One row per service run.
    """

    run = models.OneToOneField("runs.Run", on_delete=models.CASCADE, primary_key=True, related_name="service_stats")
    requests = models.BigIntegerField(default=0)
    updated = models.DateTimeField(auto_now=True)
