"""The `muster` command-line client: a thin HTTP client of the REST API.

A top-level package, not part of `muster` (the settings package, whose `__init__` loads the Celery
app), so that running a client command imports neither Django nor Celery. Only `muster serve`
reaches into the server, and only when that command runs.
"""
