"""The web answers /proxy/services/... with a 307 to the endpoint (the streams are the endpoint's,
never a web worker's), keeping the method, the path as sent and the query; a 503 when the
endpoint's URL is the web's own origin (a redirect would loop)."""

from __future__ import annotations

import pytest
from django.test import Client


@pytest.mark.django_db
@pytest.mark.parametrize("method", ["get", "post", "put", "delete"])
def test_the_web_redirects_every_method_to_the_endpoint(settings, method):
    settings.MUSTER = {**settings.MUSTER, "ENDPOINT_URL": "https://models.example.com"}
    got = getattr(Client(), method)("/proxy/services/main/llm/v1/chat?stream=1", HTTP_HOST="muster.example.com")
    assert got.status_code == 307
    assert got["Location"] == "https://models.example.com/proxy/services/main/llm/v1/chat?stream=1"


def test_muster_serve_names_the_endpoint_where_it_listens_unless_a_public_url_is_given(monkeypatch):
    from muster import serve

    monkeypatch.delenv("MUSTER_ENDPOINT_BIND", raising=False)
    assert serve.endpoint_bind("10.1.2.3") == "10.1.2.3:8001"
    monkeypatch.setenv("MUSTER_ENDPOINT_BIND", "0.0.0.0:9001")
    assert serve.endpoint_bind("10.1.2.3") == "0.0.0.0:9001"
    assert serve._reachable("0.0.0.0") == "127.0.0.1"


@pytest.mark.django_db
def test_an_endpoint_url_that_is_the_webs_own_origin_is_a_503_not_a_loop(settings):
    settings.MUSTER = {**settings.MUSTER, "ENDPOINT_URL": "http://muster.example.com"}
    got = Client().get("/proxy/services/main/llm/", HTTP_HOST="muster.example.com")
    assert got.status_code == 503 and "route /proxy/" in got.json()["detail"]


@pytest.mark.django_db
@pytest.mark.parametrize("raw", ["http://evil.example/proxy/services/main/llm/", "//evil.example/x", "/other"])
def test_a_raw_uri_that_is_not_a_services_path_is_not_the_location(settings, raw):
    settings.MUSTER = {**settings.MUSTER, "ENDPOINT_URL": "https://models.example.com"}
    got = Client().get("/proxy/services/main/llm/x?a=1", HTTP_HOST="muster.example.com", RAW_URI=raw)
    assert got.status_code == 307
    assert got["Location"] == "https://models.example.com/proxy/services/main/llm/x?a=1"
    kept = Client().get("/proxy/services/main/llm/x", HTTP_HOST="muster.example.com", RAW_URI="/proxy/services/main/llm/%2e")
    assert kept["Location"] == "https://models.example.com/proxy/services/main/llm/%2e"  # as sent: the endpoint judges it
