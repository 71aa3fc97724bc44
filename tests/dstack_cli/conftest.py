import pytest

from tests.api.test_access_matrix import world  # noqa: F401 - the native access matrix's world, for the dstack one
from tests.dstack_cli.bodies import dstack_client


@pytest.fixture
def alice(make_user):
    """An admin of project `main`, as dstack's client calls."""
    return dstack_client(make_user("alice"))
