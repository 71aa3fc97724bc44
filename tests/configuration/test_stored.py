"""The stored configuration, typed (runs/configuration/stored.py): the server's fields apart from
the user's, the engine's old defaults for keys a row lacks, frozen, and built once per run."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from runs.configuration import parse_run_configuration
from runs.configuration.failure_policy import DEFAULT_MAX_RESTARTS
from runs.configuration.stored import STORED_TYPES, run_configuration, stored_run

TWO_GROUPS = """
type: task
image: ubuntu
privileged: true
volumes: [/data:/data]
registry_auth: {username: robot, password: hunter2}
retry: {on_events: [no-capacity, error], duration: 2h}
groups:
  - name: web
    commands: [serve]
    probes: [{type: http, url: /health, port: 8000}]
    ports: [8000]
    on_failure: restart-group
  - name: work
    nodes: 2
    commands: ["echo ${{ groups[0].nodes[0].IP_ADDRESS }}"]
    depends_on: [web]
    on_failure: [{on_events: [error], on_exit_codes: [3], action: ignore}]
    max_restarts: 5
"""


def stored(doc: str = TWO_GROUPS) -> dict:
    """What submission.py stores: the checked configuration as JSON, plus the server's keys."""
    return {**json.loads(parse_run_configuration(doc).model_dump_json()), "secret_env": "sealed",
            "hidden_env": ["HF_TOKEN"], "secret_registry_password": "sealed-password"}


def test_the_users_fields_and_the_servers_are_apart():
    conf = stored_run(stored())
    assert conf.type == "task" and conf.server.secret_env == "sealed"
    assert conf.server.hidden_env == ("HF_TOKEN",) and conf.server.registry_password == "sealed-password"
    assert "secret_env" not in conf.model_dump() and "hidden_env" not in conf.model_dump()
    web, work = conf.groups
    assert (web.name, web.ports, web.probes[0].port, web.on_failure[0].action) == ("web", (8000,), 8000, "restart-group")
    assert work.depends_on[0].group == "web" and work.on_failure[0].on_exit_codes == (3,) and work.max_restarts == 5
    assert conf.container.privileged and conf.container.volumes[0].instance_path == "/data"
    assert conf.container.registry_auth.username == "robot" and conf.retry.duration == 7200


def test_the_runner_is_handed_the_probes_as_stored():
    raw = stored()
    assert [p.model_dump(mode="json") for p in stored_run(raw).groups[0].probes] == raw["groups"][0]["probes"]


def test_a_row_without_a_key_reads_as_the_engine_always_read_it():
    conf = stored_run({"type": "task", "groups": [{"name": "a", "commands": ["x"], "env": {}, "slices": None}]})
    group = conf.group(0)
    assert (conf.startup_order, conf.stop_criteria, conf.retry, conf.max_duration) == ("any", "all-done", None, None)
    assert (group.slices, group.ready_timeout, group.max_restarts, group.probes) == (1, 0, DEFAULT_MAX_RESTARTS, ())
    assert conf.group(5).name == "" and conf.group(-1).commands == ()
    assert conf.server.hidden_env == () and conf.server.registry_password is None
    assert stored_run(None).groups == ()


def test_it_is_frozen():
    conf = stored_run(stored())
    with pytest.raises(ValidationError):
        conf.stop_criteria = "master-done"
    with pytest.raises(ValidationError):
        conf.groups[0].name = "other"
    with pytest.raises(TypeError):
        conf.groups[0].commands[0] = "rm -rf /"


def test_the_type_picks_the_variant():
    assert set(STORED_TYPES) == {"task", "service"}
    service = stored_run({"type": "service", "port": 8000, "groups": [
        {"name": "web", "replicas": {"min": 0, "max": 3}, "scaling": {"target": 10}}]})
    assert (service.type, service.port, service.auth, service.strip_prefix) == ("service", 8000, True, True)
    assert service.replica_group("web").replicas.max == 3 and service.replica_group("web").scaling.metric == "rps"
    assert stored_run({"type": "task"}).groups == () and stored_run({}).type == "task"
    with pytest.raises(KeyError):
        stored_run({"type": "dev-environment"})


def test_it_is_built_once_per_run_and_again_when_the_configuration_is_replaced():
    run = SimpleNamespace(configuration=stored())
    first = run_configuration(run)
    assert run_configuration(run) is first
    run.configuration = {**run.configuration, "stop_criteria": "master-done"}
    assert run_configuration(run).stop_criteria == "master-done"
