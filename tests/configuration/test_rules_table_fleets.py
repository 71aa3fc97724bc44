"""Every rule of the configuration language for fleets, one row each (tests/configuration/rules.py
says how a row is checked; tasks: test_rules_table.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.configuration.rules import bad, check_rule, ok, yaml

FLEET_CASES = [
    # ---- fleets ----------------------------------------------------------------------------
    ok(
        "ssh-fleet",
        yaml("""
        type: fleet
        name: pd-disagg
        placement: cluster
        ssh_config:
          user: ubuntu
          private_key: KEY
          hosts:
            - 10.0.0.1
            - {hostname: 10.0.0.2, port: 2222, user: root}
        """),
        {
            "placement": "cluster",
            "ssh_config.hosts.0": {
                "hostname": "10.0.0.1",
                "port": 22,
                "user": "ubuntu",
                "identity_file": None,
                "private_key": "KEY",
                "host_key": None,
            },
            "ssh_config.hosts.1.user": "root",
            "ssh_config.hosts.1.port": 2222,
            "backends": None,
        },
    ),
    ok(
        "ssh-fleet-same-address-other-port",
        {
            "type": "fleet",
            "name": "f",
            "ssh_config": {
                "user": "u",
                "identity_file": "~/.ssh/id",
                "hosts": [{"hostname": "127.0.0.1", "port": 2201}, {"hostname": "127.0.0.1", "port": 2202}],
            },
        },
        {"ssh_config.hosts.1.port": 2202},
    ),
    bad(
        "ssh-fleet-host-twice",
        {
            "type": "fleet",
            "name": "f",
            "ssh_config": {"user": "u", "private_key": "k", "hosts": ["10.0.0.1", "10.0.0.2", "10.0.0.1"]},
        },
        ["ssh_config", "hosts", 2],
        "host `10.0.0.1` (port 22) is listed twice",
    ),
    bad(
        "ssh-and-backends",
        {
            "type": "fleet",
            "name": "f",
            "backends": ["gcp"],
            "ssh_config": {"user": "u", "private_key": "k", "hosts": ["h"]},
        },
        ["backends"],
        "cannot be used together",
    ),
    bad("fleet-without-hosts-or-backends", {"type": "fleet", "name": "f"}, ["ssh_config"], "backends"),
    bad("fleet-name-required", {"type": "fleet", "backends": ["gcp"]}, ["name"], "`name` is required"),
    bad(
        "ssh-host-without-user",
        {"type": "fleet", "name": "f", "ssh_config": {"private_key": "k", "hosts": ["h"]}},
        ["ssh_config", "hosts", 0],
        "no user for host `h`",
    ),
    bad(
        "ssh-host-unknown-key",
        {
            "type": "fleet",
            "name": "f",
            "ssh_config": {"user": "u", "private_key": "k", "hosts": [{"hostname": "h", "prot": 22}]},
        },
        ["ssh_config", "hosts", 0, "prot"],
        "unknown key `prot`",
    ),
    bad(
        "ssh-fleet-with-cloud-key",
        {
            "type": "fleet",
            "name": "f",
            "nodes": 2,
            "ssh_config": {"user": "u", "private_key": "k", "hosts": ["h"]},
        },
        ["nodes"],
        "cloud fleets",
    ),
    ok(
        "cloud-tpu-fleet",
        {
            "type": "fleet",
            "name": "pod",
            "backends": ["gcp"],
            "resources": {"gpu": "v2-32"},
            "spot": True,
            "zones": ["us-central1-a"],
            "runtime_version": "tpu-ubuntu2204-base",
        },
        {
            "nodes": {"min": 4, "max": 4},
            "resources.gpu.tpu": "v2-32",
            "spot": True,
            "idle_duration": 259200,
            "runtime_version": "tpu-ubuntu2204-base",
        },
    ),
    ok(
        "cloud-fleet-node-range",
        {"type": "fleet", "name": "pool", "backends": ["local"], "nodes": "0..4", "idle_duration": "off"},
        {"nodes": {"min": 0, "max": 4}, "idle_duration": None},
    ),
    ok(
        "cloud-fleet-idle-duration",
        {"type": "fleet", "name": "pool", "backends": ["gcp"], "idle_duration": "30m"},
        {"idle_duration": 1800, "nodes": {"min": 1, "max": 1}},
    ),
    bad(
        "cloud-fleet-unknown-backend",
        {"type": "fleet", "name": "f", "backends": ["aws"]},
        ["backends"],
        "Muster has no `aws` backend: it supports gcp",
    ),
    bad(
        "cloud-tpu-fleet-partial-slice",
        {"type": "fleet", "name": "f", "backends": ["gcp"], "nodes": 6, "resources": {"gpu": "v2-32"}},
        ["nodes"],
        "multiple of 4",
    ),
]


@pytest.mark.parametrize(("doc", "kwargs", "expect", "loc", "phrase"), FLEET_CASES)
def test_fleet_configuration_rule(
    doc: Any, kwargs: dict, expect: dict | None, loc: list | None, phrase: str | None
) -> None:
    check_rule(doc, kwargs, expect, loc, phrase)
