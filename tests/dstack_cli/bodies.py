"""What the HTTP tests of the /dstack layer send: the bodies dstack 0.22.5's CLI sends (reference
§6) and a client that sends them as it does (POST + JSON, `Authorization: Bearer`)."""

from __future__ import annotations

from rest_framework.test import APIClient

from instances.models import Fleet, FleetBackend, Instance, InstanceStatus, Placement
from projects.models import Project
from tests.conftest import token_for

# `type: task, nodes: 2, commands: [...]` as the 0.22.5 CLI dumps it, client defaults included
TASK = {"nodes": 2, "ports": [], "commands": ["echo hi from $DSTACK_NODE_RANK"], "type": "task", "name": "hello",
        "image": None, "user": None, "privileged": False, "entrypoint": None, "working_dir": None,
        "home_dir": "/root", "registry_auth": None, "python": None, "nvcc": None, "single_branch": None,
        "env": {}, "shell": None,
        "resources": {"cpu": {"arch": None, "count": {"min": 2, "max": None}}, "memory": {"min": 8.0, "max": None},
                      "shm_size": None, "gpu": {"vendor": None, "name": None, "count": {"min": 0, "max": None},
                                                "memory": None, "total_memory": None, "compute_capability": None},
                      "disk": {"size": {"min": 100.0, "max": None}}},
        "priority": None, "volumes": [], "docker": None, "repos": [], "files": [], "dstack": False, "setup": [],
        "backends": None, "regions": None, "spot_policy": None, "retry": None, "max_duration": None}
RUN_SPEC = {"run_name": "hello", "repo_id": "none", "repo_data": {"repo_type": "virtual"},
            "configuration_path": "task.yml", "configuration": TASK, "profile": None, "ssh_key_pub": "x"}
PRIVATE = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAAfake\n-----END OPENSSH PRIVATE KEY-----\n"
FLEET_SPEC = {"configuration": {
    "type": "fleet", "name": "ssh2", "placement": "cluster", "blocks": 1, "nodes": None, "env": {},
    "ssh_config": {"user": "ubuntu", "port": None, "identity_file": "/home/u/.ssh/id", "proxy_jump": None,
                   "network": None, "ssh_key": {"public": "ssh-ed25519 AAAA", "private": PRIVATE},
                   "hosts": [{"hostname": "10.9.0.1", "port": 22, "user": None, "identity_file": None,
                              "proxy_jump": None, "internal_ip": None, "ssh_key": None, "blocks": None}]}},
    "configuration_path": "fleet.yml", "profile": {"name": "default"}}


def dstack_client(user) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token_for(user)}", HTTP_X_API_VERSION="0.22.5")
    return client


def post(client, path, body=None):
    return client.post(f"/dstack/api/{path}", body, format="json") if body is not None \
        else client.post(f"/dstack/api/{path}")


def one_detail(answer, status: int, code: str) -> str:
    assert answer.status_code == status, (answer.status_code, answer.content)
    entries = answer.json()["detail"]
    assert len(entries) == 1 and entries[0]["code"] == code, entries
    return entries[0]["msg"]


def small_fleet(project_name="main", name="small", memory=2.0):
    project = Project.objects.get(name=project_name)
    fleet = Fleet.objects.create(project=project, name=name, backend=FleetBackend.SSH, placement=Placement.CLUSTER)
    for i in range(2):
        Instance.objects.create(project=project, fleet=fleet, index=i, name=f"{name}-{i}", status=InstanceStatus.IDLE,
                                backend=FleetBackend.SSH, hostname=f"10.9.0.{i + 1}",
                                resources={"cpus": 1, "memory_gb": memory, "disk_gb": 20.0, "gpus": []})
    return fleet
