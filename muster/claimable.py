"""The lease columns every claimed row carries (engine/claims.py is the protocol that uses them).

Here, below the apps, so that a model can be claimable without its package importing the engine:
the tables are the lowest layer above muster/ (tests/test_import_graph.py).
"""

from django.db import models


class Claimable(models.Model):
    lease_until = models.DateTimeField(null=True, blank=True, db_index=True)
    lease_token = models.CharField(max_length=32, blank=True, default="")

    class Meta:
        abstract = True
