"""The operator console (server-rendered pages) and /metrics.

Not held to the module set of the API apps (tests/test_app_layout.py): it owns no API and no
business rules. Its pages call the other apps' services and serializers, so an api/ or services/
here would be empty or a second copy; its one model (Counter) is written by Celery signal handlers
for /metrics, not by a user, so it has no admin either.
"""
