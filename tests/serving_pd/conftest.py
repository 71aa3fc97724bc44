"""The engine's messages recorded instead of sent, as in tests/engine (outcome_helpers.Sent)."""

from tests.engine.conftest import sent  # noqa: F401 (the fixture)
