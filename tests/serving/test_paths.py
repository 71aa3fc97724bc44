"""What the endpoint refuses of a request's target before any replica is touched (serving/proxy/paths.py),
every spelling of a climb out of the service's prefix included; and the headers a replica gets."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict

from serving.proxy.paths import Refused, key_in_query, parse, request_headers, trusted_networks, upstream_path

BASE = "/proxy/services/main/llm"


@pytest.mark.parametrize("tail", ["/../../other/llm/", "/%2e%2e/%2E%2E/other/llm/", "/.%2e/x", "/a/./b", "/a%2fb",
                                  "/a%2Fb", "/a%5cb", "/a\\b", "/a%00b", "//etc", "/a/.."])
def test_a_climb_or_an_encoded_separator_is_a_400(tail):
    with pytest.raises(Refused) as refused:
        parse(BASE + tail)
    assert refused.value.code == 400


@pytest.mark.parametrize("path", ["/proxy/services/main", "/proxy/services/", "/proxy/services/m%41in/llm/",
                                  "/proxy/services/-x/llm/", "/proxy/services/main/ll m/"])
def test_a_target_that_names_no_service_is_a_404(path):
    with pytest.raises(Refused) as refused:
        parse(path)
    assert refused.value.code == 404


def test_the_service_and_the_rest_as_sent():
    target = parse(BASE + "/v1/chat%20x/completions?stream=true&x=%2F")
    assert (target.project, target.run, target.tail, target.query) == ("main", "llm", "/v1/chat%20x/completions",
                                                                       "stream=true&x=%2F")
    assert upstream_path(target, strip_prefix=True) == "/v1/chat%20x/completions?stream=true&x=%2F"
    assert upstream_path(target, strip_prefix=False) == BASE + "/v1/chat%20x/completions?stream=true&x=%2F"
    assert parse(BASE).trailing_slash_missing and parse(BASE + "/").tail == "/"


def test_a_muster_key_in_the_query_is_seen():
    assert key_in_query("token=mst_abc") and key_in_query("a=1&mst_abc") and not key_in_query("token=abc")


def test_hop_by_hop_muster_and_auth_headers_stay_behind():
    sent = CIMultiDict([("Authorization", "Bearer mst_x"), ("Connection", "keep-alive, X-Private"),
                        ("X-Private", "1"), ("Keep-Alive", "5"), ("X-Muster-Project", "main"), ("Accept", "a"),
                        ("Cookie", "sessionid=1; csrftoken=2; theme=dark"), ("X-Forwarded-For", "10.0.0.1")])
    got = CIMultiDict(request_headers(sent, auth=True, muster_cookies=frozenset({"sessionid", "csrftoken"}),
                                      peer="10.0.0.2", host="models.example.com", scheme="https", prefix=BASE,
                                      trusted=trusted_networks("10.0.0.2")))
    assert "Authorization" not in got and "X-Private" not in got and "Keep-Alive" not in got
    assert "X-Muster-Project" not in got and "Connection" not in got
    assert got["Cookie"] == "theme=dark" and got["Accept"] == "a"
    assert got["X-Forwarded-For"] == "10.0.0.1, 10.0.0.2" and got["X-Forwarded-Prefix"] == BASE
    opened = CIMultiDict(request_headers(sent, auth=False, muster_cookies=frozenset(), peer="p", host="h",
                                         scheme="http", prefix=None))
    assert opened["Authorization"] == "Bearer mst_x"


def test_a_replicas_cookie_for_the_console_or_another_domain_stays_behind():
    from serving.proxy.paths import response_headers

    sent = CIMultiDict([("Set-Cookie", "sessionid=stolen; Path=/"), ("Set-Cookie", "csrftoken=x"),
                        ("Set-Cookie", "wide=1; Path=/; domain=.example.com"), ("Set-Cookie", "app=kept; Path=/"),
                        ("Content-Type", "text/plain")])
    got = response_headers(sent, frozenset({"sessionid", "csrftoken"}))
    assert [v for k, v in got if k == "Set-Cookie"] == ["app=kept; Path=/"]
    assert ("Content-Type", "text/plain") in got


def test_forwarded_headers_are_believed_only_from_a_trusted_proxy():
    sent = CIMultiDict([("X-Forwarded-For", "1.2.3.4"), ("X-Forwarded-Host", "bank.example"),
                        ("X-Forwarded-Proto", "https")])
    trusted = trusted_networks("127.0.0.1/32, ::1, 10.1.0.0/16")

    def seen(peer):
        return CIMultiDict(request_headers(sent, auth=False, muster_cookies=frozenset(), peer=peer,
                                           host="models.example.com", scheme="http", prefix=None, trusted=trusted))

    for peer in ("10.1.2.3", "::1", "127.0.0.1"):
        got = seen(peer)
        assert got["X-Forwarded-For"] == f"1.2.3.4, {peer}"
        assert got["X-Forwarded-Host"] == "bank.example" and got["X-Forwarded-Proto"] == "https"
    for peer in ("10.2.0.1", "127.0.0.2", ""):
        got = seen(peer)
        assert got.getall("X-Forwarded-For") == [peer] and got.getall("X-Forwarded-Host") == ["models.example.com"]
        assert got.getall("X-Forwarded-Proto") == ["http"]
