"""API tokens: stored as hashes only, shown once, and refused once expired."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from projects.models import ApiToken
from tests.conftest import client_for, token_for

pytestmark = pytest.mark.django_db

RUNS = "/api/projects/p1/runs/"


def muster_token(*args: str) -> str:
    out = io.StringIO()
    call_command("muster_token", *args, stdout=out)
    return out.getvalue().strip()


def client_with(key: str):
    client = client_for(None)
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def test_the_token_table_holds_nothing_a_thief_can_authenticate_with():
    key = muster_token("bob", "--project", "p1")
    assert client_with(key).get(RUNS).status_code == 200

    stolen = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names():
            cursor.execute(f'SELECT * FROM "{table}"')
            for row in cursor.fetchall():
                stolen.extend(str(v) for v in row if v is not None)
                assert not any(key in str(v) for v in row), f"the key is readable in {table}"
        cursor.execute(f'SELECT * FROM "{ApiToken._meta.db_table}"')
        (token_row,) = cursor.fetchall()
    for value in [str(v) for v in token_row if v is not None]:
        assert client_with(value).get(RUNS).status_code == 401, f"a raw column ({value!r}) is a working token"


def test_an_expired_token_is_refused_with_a_401_saying_so():
    key = muster_token("bob", "--project", "p1", "--expires-in", "1")
    client = client_with(key)
    assert client.get(RUNS).status_code == 200
    token = ApiToken.objects.get(user__username="bob")
    assert timedelta(hours=23) < token.expires - timezone.now() <= timedelta(days=1)

    ApiToken.objects.filter(pk=token.pk).update(expires=timezone.now() - timedelta(seconds=1))  # a day later
    resp = client.get(RUNS)
    assert resp.status_code == 401
    assert "expired" in resp.json()["errors"][0]["msg"]
    assert resp.headers["WWW-Authenticate"] == "Token"


def test_tokens_expire_after_the_configured_default_lifetime_and_0_means_never(settings, make_user):
    settings.MUSTER = {**settings.MUSTER, "TOKEN_LIFETIME_DAYS": 7}
    user = make_user("carol", project="p1")
    token_for(user)
    (token,) = ApiToken.objects.filter(user=user)
    assert timedelta(days=6) < token.expires - timezone.now() <= timedelta(days=7)
    muster_token("carol", "--expires-in", "0")
    assert ApiToken.objects.filter(user=user, expires__isnull=True).count() == 1


def test_revoke_deletes_the_users_old_tokens():
    old = muster_token("bob", "--project", "p1")
    new = muster_token("bob", "--revoke")
    assert client_with(old).get(RUNS).status_code == 401
    assert client_with(new).get(RUNS).status_code == 200


def test_a_deactivated_users_token_stops_working(make_user):
    user = make_user("dave", project="p1")
    client = client_for(user)
    assert client.get(RUNS).status_code == 200
    user.is_active = False
    user.save()
    assert client.get(RUNS).status_code == 401


@pytest.mark.django_db(transaction=True)
def test_an_upgrade_hashes_the_old_plaintext_tokens_and_they_keep_working(django_user_model):
    from django.db.migrations.executor import MigrationExecutor

    from projects.models import Membership, Project

    old_key = "0123456789abcdef0123456789abcdef01234567"  # what rest_framework.authtoken handed out
    user = django_user_model.objects.create_user("veteran")
    MigrationExecutor(connection).migrate([("projects", "0001_initial")])  # the schema before hashed tokens
    try:
        with connection.cursor() as cursor:
            # the table rest_framework.authtoken kept, as the previous release left it
            cursor.execute('CREATE TABLE "authtoken_token" ("key" varchar(40) NOT NULL PRIMARY KEY, '
                           '"created" timestamp NOT NULL, "user_id" integer NOT NULL UNIQUE)')
            cursor.execute('INSERT INTO "authtoken_token" VALUES (%s, %s, %s)', [old_key, timezone.now(), user.pk])
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())

        with connection.cursor() as cursor:
            cursor.execute('SELECT COUNT(*) FROM "authtoken_token"')
            assert cursor.fetchone()[0] == 0, "no plaintext token is left behind"
        token = ApiToken.objects.get(user=user)
        assert old_key not in (token.digest, token.prefix) and token.expires is None
        Membership.objects.create(project=Project.objects.create(name="p1"), user=user, role="user")
        assert client_with(old_key).get(RUNS).status_code == 200, "clients of the old release keep working"
    finally:
        with connection.cursor() as cursor:
            cursor.execute('DROP TABLE IF EXISTS "authtoken_token"')
