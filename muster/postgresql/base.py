"""Django's PostgreSQL backend, without a health check on a connection that has just proved itself.

With CONN_HEALTH_CHECKS, Django sends `SELECT 1` before the first statement of every request, and
Celery's Django fix-up makes every task a "request": one more round trip per API request and per
task execution (about 4.5 per placed job), uncounted by the bench's statement counter because it
bypasses Django's cursor. A connection whose last request or task ended without a database error
less than FRESH_SECONDS ago is taken as alive; one idle for longer (where a server restart or a
dropped connection hides) is still checked. A connection that breaks inside that window fails its
next statement, as one breaking mid-request does with every check on, and is closed at the end of
that request (Django's `errors_occurred` path). docs/how-it-works.md has the background.
"""

from __future__ import annotations

import time

from django.db.backends.postgresql import base

FRESH_SECONDS = 1.0


class DatabaseWrapper(base.DatabaseWrapper):
    _good_at: float | None = None  # time.monotonic() when a request or task last ended on it cleanly

    def connect(self):
        self._good_at = None
        super().connect()

    def close_if_unusable_or_obsolete(self):
        # Called at a request's or a task's start and end. health_check_done is set when a statement
        # is about to run and cleared here, so it says whether one ran since the last call; if one
        # did and the connection is still open, it ran without an error (or is_usable just said
        # so), so the connection was alive now. A call with nothing run since leaves the time alone.
        used = self.connection is not None and self.health_check_done
        super().close_if_unusable_or_obsolete()
        if self.connection is None:
            self._good_at = None
        elif used:
            self._good_at = time.monotonic()

    def close_if_health_check_failed(self):
        if (self.connection is not None and self.health_check_enabled and not self.health_check_done
                and self._good_at is not None and time.monotonic() - self._good_at < FRESH_SECONDS):
            self.health_check_done = True
            return
        super().close_if_health_check_failed()
