"""Run by tests/test_concurrent_suites.py as a whole pytest run of its own (not collected by `make
test`: the name does not start with test_): it holds its test database for a while and checks the
database is still there and its own."""

import time

import pytest


@pytest.mark.django_db(transaction=True)
def test_the_database_of_this_run_stays_its_own_while_another_run_starts():
    from django.db import connection

    from projects.models import Project

    Project.objects.create(name="probe")
    time.sleep(6)  # the other run creates its test database meanwhile
    assert list(Project.objects.values_list("name", flat=True)) == ["probe"]
    print("database:", connection.settings_dict["NAME"])
