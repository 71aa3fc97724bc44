"""How much of the gateway one client may hold: connections in all, per address and per user.

A client that finishes the key exchange holds a connection before it proves anything, so the total
alone would let 64 idle clients lock everyone out: each address gets a share of its own, and each
user (counted from the first key that logs in) another, so one key's owner cannot take every slot
either. The numbers are settings (DSTACK_SSH_MAX_*), read at each check so a change needs no restart
of the thread that counts.
"""

from __future__ import annotations

import threading
from collections import Counter

from django.conf import settings


def limit(name: str) -> int:
    muster = settings.MUSTER
    return int({"DSTACK_SSH_MAX_CONNECTIONS": muster["DSTACK_SSH_MAX_CONNECTIONS"],
                "DSTACK_SSH_MAX_PER_ADDRESS": muster["DSTACK_SSH_MAX_PER_ADDRESS"],
                "DSTACK_SSH_MAX_PER_USER": muster["DSTACK_SSH_MAX_PER_USER"],
                "DSTACK_SSH_MAX_CHANNELS": muster["DSTACK_SSH_MAX_CHANNELS"],
                "DSTACK_SSH_MAX_LOG_STREAMS": muster["DSTACK_SSH_MAX_LOG_STREAMS"]}[name])


class Counts:
    """Open connections by client address and by user, under one lock."""

    def __init__(self):
        self.lock = threading.Lock()
        self.total = 0
        self.by_address: Counter[str] = Counter()
        self.by_user: Counter[int] = Counter()
        self.log_streams = 0  # each polls the database: capped below the server's connection budget

    def open_log(self) -> bool:
        with self.lock:
            if self.log_streams >= limit("DSTACK_SSH_MAX_LOG_STREAMS"):
                return False
            self.log_streams += 1
            return True

    def close_log(self) -> None:
        with self.lock:
            self.log_streams -= 1

    def admit(self, address: str) -> str:
        """Take a connection slot for `address`; why not ("" when taken)."""
        with self.lock:
            if self.total >= limit("DSTACK_SSH_MAX_CONNECTIONS"):
                return "the gateway is full (DSTACK_SSH_MAX_CONNECTIONS)"
            if self.by_address[address] >= limit("DSTACK_SSH_MAX_PER_ADDRESS"):
                return "this address holds its share (DSTACK_SSH_MAX_PER_ADDRESS)"
            self.total += 1
            self.by_address[address] += 1
            return ""

    def release(self, address: str) -> None:
        with self.lock:
            self.total -= 1
            self.by_address[address] -= 1
            if self.by_address[address] <= 0:
                del self.by_address[address]

    def logged_in(self, user_pk: int) -> int:
        with self.lock:
            return self.by_user[user_pk]

    def login(self, user_pk: int) -> bool:
        with self.lock:
            if self.by_user[user_pk] >= limit("DSTACK_SSH_MAX_PER_USER"):
                return False
            self.by_user[user_pk] += 1
            return True

    def logout(self, user_pk: int) -> None:
        with self.lock:
            self.by_user[user_pk] -= 1
            if self.by_user[user_pk] <= 0:
                del self.by_user[user_pk]
