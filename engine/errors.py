"""The engine's own errors: what a step refuses, in the shape every Muster error has (`errors`, each
{loc, msg}), and none of the API's types, so the engine imports nothing of the layer above it.

They are raised and caught inside the engine: a registration's refusal (engine/ssh_registration.py)
becomes its fleet's `errors`, which `GET fleets/X` and `muster fleet apply` show as they are. No
request runs an engine step (tests/test_import_graph.py), so none reaches an answer of the API;
the API's own refusals are muster/api_errors.py's.
"""

from __future__ import annotations


class Refused(Exception):
    """The engine will not do this as asked; `errors` says where and why, first error first."""

    def __init__(self, loc: list, msg: str, errors: list[dict] | None = None):
        super().__init__(msg)
        self.errors = errors or [{"loc": loc, "msg": msg}]

    @classmethod
    def of(cls, errors: list[dict]) -> Refused:
        return cls(errors[0]["loc"], errors[0]["msg"], errors)


class RegistrationRefused(Refused):
    """An SSH fleet's hosts do not make the fleet (a host did not answer, is registered elsewhere,
    or the hosts share no network): the fleet fails with these errors."""
