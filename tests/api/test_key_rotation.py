"""Encryption keys at rest: independent of SECRET_KEY, rotated without losing a secret."""

from __future__ import annotations

import io

import pytest
from cryptography.fernet import Fernet
from django.core.management import CommandError, call_command

from muster import crypto
from projects.models import Secret
from runs.job_rows import secret_env
from runs.models import Run

pytestmark = pytest.mark.django_db

OLD, NEW, STRANGER = (Fernet.generate_key().decode() for _ in range(3))
PLAN = "/api/projects/main/runs/plan"
TASK = "type: task\nname: uses-secret\nenv: [HF_TOKEN]\ncommands: [echo]\n"


@pytest.fixture
def keys(settings):
    def use(*keys: str, secret_key: str | None = None) -> None:
        settings.MUSTER_ENCRYPTION_KEYS = list(keys)
        if secret_key:
            settings.SECRET_KEY = secret_key
    use(OLD)
    return use


def set_secret(api, value="hf_kept"):
    assert api.post("/api/projects/main/secrets/", {"name": "HF_TOKEN", "value": value}, format="json").status_code == 201


def plan(api):
    return api.post(PLAN, {"configuration": TASK}, format="json")


def reencrypt() -> str:
    out = io.StringIO()
    call_command("muster_reencrypt", stdout=out)
    return out.getvalue()


def test_rotating_secret_key_leaves_secrets_readable(api, keys):
    set_secret(api)
    keys(OLD, secret_key="a-brand-new-secret-key")
    resp = plan(api)
    assert resp.status_code == 200, resp.content


def test_a_new_key_first_then_reencrypt_then_the_old_key_can_go(api, keys):
    set_secret(api)
    assert api.post("/api/projects/main/runs/", {"configuration": TASK}, format="json").status_code == 201
    keys(NEW, OLD)
    assert plan(api).status_code == 200
    assert "re-encrypted 2 values" in reencrypt()  # the secret and the run's stored secret env
    keys(NEW)
    assert plan(api).status_code == 200
    assert secret_env(Run.objects.get(name="uses-secret")) == {"HF_TOKEN": "hf_kept"}, "what the job is started with"


def test_a_secret_no_key_opens_is_a_409_naming_it_not_a_500(api, keys):
    set_secret(api)
    keys(STRANGER)
    resp = plan(api)
    assert resp.status_code == 409
    (error,) = resp.json()["errors"]
    assert error["loc"] == ["secrets", "HF_TOKEN"]
    assert "HF_TOKEN" in error["msg"] and "MUSTER_ENCRYPTION_KEYS" in error["msg"]
    with pytest.raises(CommandError, match="HF_TOKEN"):
        reencrypt()


def test_values_encrypted_with_the_old_secret_key_derived_key_survive_the_upgrade(api, project, keys, settings):
    # what the server before MUSTER_ENCRYPTION_KEYS wrote: Fernet with a key derived from SECRET_KEY
    legacy = Fernet(crypto.legacy_key(settings.SECRET_KEY)).encrypt(b"hf_from_before").decode()
    Secret.objects.create(project=project, name="HF_TOKEN", value_encrypted=legacy)
    assert plan(api).status_code == 200
    reencrypt()
    keys(OLD, secret_key="rotated-after-the-upgrade")
    assert plan(api).status_code == 200
    assert Secret.objects.get(name="HF_TOKEN").value == "hf_from_before"


@pytest.mark.django_db(transaction=True)
def test_a_run_whose_secret_env_no_key_opens_fails_saying_so_instead_of_hanging(request, api, keys, superuser_api,
                                                                                 fast_limits):
    from engine.groups import terminate_fleet_instances
    from instances.models import Fleet
    from tests.engine.helpers import wait_for_run

    fleet_conf = "type: fleet\nname: here\nbackends: [local]\nnodes: 1\n"
    assert superuser_api.post("/api/projects/main/fleets/", {"configuration": fleet_conf}, format="json").status_code == 201
    try:
        set_secret(api)
        assert api.post("/api/projects/main/runs/", {"configuration": TASK}, format="json").status_code == 201
        keys(NEW)  # the old key dropped without muster_reencrypt, before any worker read the run
        request.getfixturevalue("celery_worker")
        run = wait_for_run("uses-secret", timeout=60)
        (job,) = run.current_jobs()
        assert (run.status, job.termination_reason) == ("failed", "executor_error"), job.termination_message
        assert "secret env of run uses-secret" in job.termination_message
        assert "MUSTER_ENCRYPTION_KEYS" in job.termination_message
    finally:
        terminate_fleet_instances(Fleet.objects.get(name="here"))


def test_reencrypt_covers_each_users_dstack_key(api, keys, django_user_model):
    from dstack_api.services import keys as dstack_keys

    made = dstack_keys.keypair_of(django_user_model.objects.get(username="alice"))
    private = made.private_key
    keys(NEW, OLD)
    assert "re-encrypted 1 values" in reencrypt()
    keys(NEW)
    made.refresh_from_db()
    assert made.private_key == private
