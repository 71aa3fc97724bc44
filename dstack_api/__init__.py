"""dstack's HTTP API under /dstack, so the stock dstack CLI (0.22.x) drives Muster (docs/dstack-cli.md).

Not one of the API apps' module set (no api/filters.py): dstack's client sends every call as a POST
with a JSON body and no query parameters, so there is nothing for a FilterSet to read. It owns one
table (each user's dstack SSH keypair) and otherwise goes through the other apps' services.
"""
