"""Every app that serves the API has the same module set, so a newcomer who knows one app knows
where everything is in the others (models, the business rules in services, and for the API its
serializers, views, filters and urls, and the admin).

Query parameters are read in one way: a FilterSet in the app's api/filters.py for those that pick
rows, a query serializer for those that say where or how (a log's `start`, a DELETE's `force`). A
view that reads `request.query_params[...]` by hand skips validation, the errors shape and the
OpenAPI schema all at once, so it fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import django_filters
import pytest
from django.urls import URLPattern, URLResolver, get_resolver

ROOT = Path(__file__).resolve().parent.parent
API_APPS = ("projects", "runs", "instances", "events")
MODULES = ("models.py", "admin.py", "api/serializers.py", "api/views.py", "api/filters.py", "api/urls.py")
EXEMPT = {
    # console/__init__.py says why: HTML pages over the other apps' services, and /metrics.
    "console": "owns no API and no business rules",
    # dstack_api/__init__.py says why: dstack's client sends no query parameters (no api/filters.py)
    "dstack_api": "dstack's HTTP API, every call a POST with a JSON body",
    # serving/__init__.py says why: a service is a run (runs' API); serving holds the endpoint
    "serving": "the endpoint's process and tables; a service is a run, served by the runs API",
}


@pytest.mark.parametrize("app", API_APPS)
def test_an_api_app_has_the_module_set(app):
    base = ROOT / app
    missing = [name for name in MODULES if not (base / name).is_file()]
    if not ((base / "services.py").is_file() or (base / "services" / "__init__.py").is_file()):
        missing.append("services.py or services/")
    assert not missing, f"{app} lacks {', '.join(missing)}"


def test_every_app_is_an_api_app_or_exempt_with_a_reason():
    from django.apps import apps

    ours = {config.name for config in apps.get_app_configs() if (ROOT / config.name).is_dir()}
    assert ours == set(API_APPS) | set(EXEMPT)
    for app in EXEMPT:
        assert "module set" in (ROOT / app / "__init__.py").read_text(), f"{app}/__init__.py must say why"


def _reads_a_query_parameter_by_hand(node: ast.AST) -> bool:
    # request.query_params.get(...), request.query_params[...], request.GET...
    if isinstance(node, ast.Attribute) and node.attr == "GET":
        return True
    if isinstance(node, ast.Attribute) and node.attr == "get":
        return isinstance(node.value, ast.Attribute) and node.value.attr == "query_params"
    if isinstance(node, ast.Subscript):
        return isinstance(node.value, ast.Attribute) and node.value.attr == "query_params"
    return False


@pytest.mark.parametrize("app", API_APPS)
def test_no_api_view_parses_query_parameters_by_hand(app):
    path = ROOT / app / "api" / "views.py"
    tree = ast.parse(path.read_text())
    lines = sorted(node.lineno for node in ast.walk(tree) if _reads_a_query_parameter_by_hand(node))
    assert not lines, f"{path.relative_to(ROOT)} reads query parameters by hand on lines {lines}: use a FilterSet"


def _views(patterns):
    for entry in patterns:
        if isinstance(entry, URLResolver):
            yield from _views(entry.url_patterns)
        elif isinstance(entry, URLPattern) and hasattr(entry.callback, "view_class"):
            yield entry.callback.view_class


@pytest.mark.parametrize("app", API_APPS)
def test_every_filterset_of_an_app_is_used_by_a_routed_view(app):
    module = __import__(f"{app}.api.filters", fromlist=["*"])
    declared = {obj for obj in vars(module).values()
                if isinstance(obj, type) and issubclass(obj, django_filters.FilterSet)
                and obj.__module__ == module.__name__}
    assert declared, f"{app}/api/filters.py declares no FilterSet"
    used = {getattr(view, "filterset_class", None) for view in _views(get_resolver().url_patterns)}
    assert declared <= used, f"not the filterset_class of any routed view: {declared - used}"


def test_the_engine_map_names_every_module_of_the_engine():
    """engine/__init__.py is a newcomer's map of the steps: a module it does not name is one they
    cannot find from there."""
    text = (ROOT / "engine" / "__init__.py").read_text()
    modules = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "engine").rglob("*.py")
                     if p.name != "__init__.py" and "__pycache__" not in p.parts)
    assert [m for m in modules if m not in text] == []
