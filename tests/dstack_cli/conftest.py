import pytest

from tests.dstack_cli.bodies import dstack_client


@pytest.fixture
def alice(make_user):
    """An admin of project `main`, as dstack's client calls."""
    return dstack_client(make_user("alice"))
