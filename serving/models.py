from __future__ import annotations

from django.db import models

from muster.claimable import Claimable


class ServiceStats(models.Model):
    """The endpoint's count of requests to one service, summed over every endpoint process.

    Each endpoint process adds what it counted since its last flush (one UPDATE ... + n, never a
    read-modify-write), so the total is exact however many processes serve; the scaler turns two
    samples of `requests` into requests per second (engine). One row per service run.
    """

    run = models.OneToOneField("runs.Run", on_delete=models.CASCADE, primary_key=True, related_name="service_stats")
    requests = models.BigIntegerField(default=0)
    updated = models.DateTimeField(auto_now=True)


class RouterSync(Claimable):
    """A routed service's router worker sync (serving/router_sync.py, the step engine/router_sync.py):
    the row the step claims, one per service run with a `router` group, and what it last saw.

    `listed`: {router job id: {worker job id: the router's worker id}} as the routers listed them at
    the last sync (after its adds and removes): engine/replicas/keep.py stops a drained replica only
    once no router lists it. `problems`: {key: message} of the failures the last sync met (a router
    that refuses the worker API, a worker it does not take), so each is one event when it starts and
    one when it ends, not one per sync. `attempts`: {"<router job> <worker job>": [adds accepted, next
    offer, first offer (epochs)]}: a worker the router refused or dropped is offered again with a
    back-off, not every sync. `routable`: {router job id: its `ready_at` (ISO)} for each router a sync
    saw ready to serve since it last became ready (serving/router_sync.py `serves`): the endpoint
    routes to a router of a routed service only once it is here with its current `ready_at`
    (serving/routes.py), so a new or restarted smg, which answers 503 until it has workers, gets no
    request before.
    """

    run = models.OneToOneField("runs.Run", on_delete=models.CASCADE, primary_key=True, related_name="router_sync")
    listed = models.JSONField(default=dict, blank=True)
    problems = models.JSONField(default=dict, blank=True)
    attempts = models.JSONField(default=dict, blank=True)
    routable = models.JSONField(default=dict, blank=True)
    synced_at = models.DateTimeField(null=True, blank=True)
