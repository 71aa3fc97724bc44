"""Password guessing at /login/ and /admin/login/ as a client sends it: locked after a few wrong
passwords, per user name and per address, with a 429 that costs no password hashing."""

from __future__ import annotations

import time

import pytest
from django.test import Client

from tests.console import counting_hasher

pytestmark = pytest.mark.django_db

PASSWORD = "the-right-password-1"
PAGES = ["/login/", "/admin/login/"]


@pytest.fixture
def limits(settings):
    settings.MUSTER = {**settings.MUSTER, "THROTTLE_LOGIN_FAILURES": 5, "THROTTLE_LOGIN_ADDRESS_FAILURES": 20,
                       "THROTTLE_LOGIN_WINDOW": 900, "THROTTLE_LOGIN_LOCK": 60, "THROTTLE_LOGIN_LOCK_MAX": 3600}
    return settings


@pytest.fixture
def admin_user_(django_user_model):
    return django_user_model.objects.create_superuser(username="operator", password=PASSWORD)


def _try(client: Client, page: str, username: str, password: str, address: str = "127.0.0.1"):
    return client.post(page, {"username": username, "password": password, "next": "/"}, REMOTE_ADDR=address)


def _logged_in(response) -> bool:
    return response.status_code == 302 and "_auth_user_id" in response.client.session


@pytest.mark.parametrize("page", PAGES)
def test_a_hundred_wrong_passwords_then_the_right_one_is_refused_while_locked(page, limits, admin_user_):
    client = Client()
    codes = [_try(client, page, "operator", f"wrong-{i}").status_code for i in range(100)]
    assert codes[:5] == [200] * 5 and set(codes[5:]) == {429}
    right = _try(client, page, "operator", PASSWORD)
    assert right.status_code == 429 and not _logged_in(right)
    assert 0 < int(right["Retry-After"]) <= 60
    assert "Too many failed log-ins" in right.content.decode()
    assert "script-src 'self'" in right["Content-Security-Policy"]


@pytest.mark.parametrize("page", PAGES)
def test_a_locked_user_name_is_locked_from_every_address_and_others_still_log_in(page, limits, admin_user_,
                                                                                 django_user_model):
    django_user_model.objects.create_superuser(username="colleague", password=PASSWORD)
    for i in range(5):
        assert _try(Client(), page, "operator", f"wrong-{i}", "10.0.0.1").status_code == 200
    assert _try(Client(), page, "operator", PASSWORD, "10.0.0.99").status_code == 429
    assert _logged_in(_try(Client(), page, "colleague", PASSWORD, "10.0.0.1"))


def test_one_address_trying_many_user_names_is_locked_and_other_addresses_are_not(limits, admin_user_):
    for i in range(20):
        assert _try(Client(), "/login/", f"nobody-{i}", "guess", "203.0.113.7").status_code == 200
    assert _try(Client(), "/login/", "operator", PASSWORD, "203.0.113.7").status_code == 429
    # another address in the same IPv6 /64 is the same client
    for i in range(20):
        _try(Client(), "/login/", f"nobody-{i}", "guess", "2001:db8::1")
    assert _try(Client(), "/login/", "operator", PASSWORD, "2001:db8::ffff").status_code == 429
    assert _logged_in(_try(Client(), "/login/", "operator", PASSWORD, "203.0.113.8"))


@pytest.mark.parametrize("page", PAGES)
def test_the_lock_expires_and_the_next_failure_locks_twice_as_long(page, limits, admin_user_):
    limits.MUSTER = {**limits.MUSTER, "THROTTLE_LOGIN_LOCK": 1}
    client = Client()
    for i in range(5):
        _try(client, page, "operator", f"wrong-{i}")
    assert _try(client, page, "operator", PASSWORD).status_code == 429
    time.sleep(1.2)
    assert _try(client, page, "operator", "wrong-again").status_code == 200
    again = _try(client, page, "operator", PASSWORD)
    assert again.status_code == 429 and int(again["Retry-After"]) == 2
    time.sleep(2.2)
    assert _logged_in(_try(client, page, "operator", PASSWORD))


def test_a_right_password_clears_the_user_names_count(limits, admin_user_):
    for _ in range(3):
        for i in range(4):
            assert _try(Client(), "/login/", "operator", f"wrong-{i}", f"10.1.0.{i}").status_code == 200
        assert _logged_in(_try(Client(), "/login/", "operator", PASSWORD, "10.2.0.1"))


@pytest.mark.parametrize("page", PAGES)
def test_a_locked_try_runs_no_password_hasher(page, limits, django_user_model):
    limits.PASSWORD_HASHERS = ["tests.console.counting_hasher.CountingPBKDF2PasswordHasher"]
    django_user_model.objects.create_superuser(username="operator", password=PASSWORD)
    client = Client()
    for i in range(5):
        _try(client, page, "operator", f"wrong-{i}")
        _try(client, page, "no-such-user", f"wrong-{i}")  # Django hashes a dummy for unknown users
    before = counting_hasher.CALLS["count"]
    assert before >= 10
    started = time.monotonic()
    for i in range(50):
        assert _try(client, page, "operator", f"wrong-{i}").status_code == 429
        assert _try(client, page, "no-such-user", f"wrong-{i}").status_code == 429
    assert counting_hasher.CALLS["count"] == before
    print(f"100 locked tries in {time.monotonic() - started:.2f} s")


@pytest.mark.django_db(transaction=True)
def test_failures_counted_by_another_web_process_lock_this_one(limits, admin_user_):
    """Another process (a second web worker) takes the wrong passwords; this one then refuses."""
    import os
    import subprocess
    import sys

    from django.db import connection

    db = connection.settings_dict
    url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    if connection.vendor != "postgresql":
        pytest.skip("needs the PostgreSQL test database, which a second process can open")
    code = ("import django; django.setup()\n"
            "from django.test import Client\n"
            "c = Client()\n"
            "print([c.post('/login/', {'username': 'operator', 'password': f'wrong-{i}'}).status_code "
            "for i in range(5)])\n")
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "muster.settings", "ALLOWED_HOSTS": "*"}
    other = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert other.stdout.strip() == "[200, 200, 200, 200, 200]", other.stderr[-2000:]
    right = _try(Client(), "/login/", "operator", PASSWORD)
    assert right.status_code == 429 and not _logged_in(right)


def _http_try(base: str, page: str, username: str, password: str) -> int:
    """One log-in through a real HTTP client (its own cookies and CSRF token): the status code."""
    import re

    import requests

    with requests.Session() as session:
        form = session.get(base + page, timeout=30)
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text).group(1)
        answer = session.post(base + page, data={"username": username, "password": password, "next": "/",
                                                 "csrfmiddlewaretoken": token},
                              headers={"Referer": base + page}, allow_redirects=False, timeout=30)
        return answer.status_code


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("page", PAGES)
def test_spellings_the_form_reads_as_the_same_name_share_its_lock(page, limits, live_server, django_user_model):
    """Django's log-in form strips a user name and NFKC-normalises it, so " admin", "admin " and a
    fullwidth "ａdmin" all log in as admin: they must count against, and be refused by, admin's lock."""
    from django.core.cache import caches

    caches["login"].clear()  # a table a transactional test's flush does not empty
    django_user_model.objects.create_superuser(username="admin", password=PASSWORD)
    spellings = [" admin", "admin ", "\uff41dmin", "admin", "\tadmin\u3000"]
    codes = [_http_try(live_server.url, page, spellings[i % len(spellings)], f"wrong-{i}") for i in range(7)]
    assert codes[:5] == [200] * 5 and codes[5:] == [429, 429], codes
    for spelling in spellings:
        assert _http_try(live_server.url, page, spelling, PASSWORD) == 429, spelling
