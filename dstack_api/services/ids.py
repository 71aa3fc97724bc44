"""Reversible UUIDs for Muster's integer ids: dstack's client types every id as a UUID.

A job's submission is the job row, which has its own uuid (the runner's job id) already.
"""

from __future__ import annotations

import uuid

# dstack's client wants version-4 UUIDs: "6d757374-<kind>-4000-8000-<pk in 48 bits>", so an id of
# one kind never reads as another's
_TAG = "6d757374"  # "must"
KINDS = {"project": 1, "user": 2, "run": 3, "fleet": 4, "instance": 5}
MAX_PK = (1 << 48) - 1


def uuid_of(kind: str, pk: int) -> str:
    return str(uuid.UUID(f"{_TAG}{KINDS[kind]:04x}40008000{int(pk):012x}"))
