"""Serving: what `type: service` runs need beyond a task's jobs.

The tables (the endpoint's request counts the scaler reads), the routing table the endpoint
reads (a service's ready replicas and how to reach them), the change notification the engine
sends when that table changes, and the endpoint itself (serving/proxy/, a process of its own).

It has no API of its own and so not the API apps' module set (tests/test_app_layout.py): a
service is a run, created, listed and stopped through the runs API; what a user sees of its
endpoint is part of the run's answer.
"""
