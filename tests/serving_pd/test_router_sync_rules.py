"""The router sync's rules without a router: which role wins, what a router should list, and the
difference between what it lists and that (serving/router_sync.py)."""

from __future__ import annotations

from types import SimpleNamespace

from django.utils import timezone

from runs.configuration.stored import StoredWorker
from serving.router_sync import Registration, diff, listed_jobs, role_of, workers_for

SGLANG_PREFILL = {"status": "ready", "disaggregation_mode": "prefill", "disaggregation_bootstrap_port": 8998}
SGLANG_PLAIN = {"status": "ready", "disaggregation_mode": "null"}


def test_the_override_wins_then_what_the_worker_reports_then_the_group_name_then_regular():
    assert role_of(StoredWorker(role="decode"), SGLANG_PREFILL, "prefill") == ("decode", None)
    assert role_of(StoredWorker(role="prefill", bootstrap_port=9000), SGLANG_PREFILL, "x") == ("prefill", 9000)
    assert role_of(StoredWorker(role="prefill"), SGLANG_PREFILL, "x") == ("prefill", 8998), "its port kept"
    assert role_of(None, SGLANG_PREFILL, "decode") == ("prefill", 8998), "what it reports beats its group's name"
    assert role_of(None, SGLANG_PLAIN, "decode") == ("regular", None), "an SGLang server that is not disaggregated"
    assert role_of(None, None, "prefill") == ("prefill", None) and role_of(None, None, "decode") == ("decode", None)
    assert role_of(None, {"unrelated": 1}, "workers") == ("regular", None)
    assert role_of(StoredWorker(bootstrap_port=7000), None, "prefill") == ("prefill", 7000)


def _job(pk, group, *, rank=0, ready=True, drain=False, deployment=0, status="running", host="10.0.0.1"):
    return SimpleNamespace(pk=pk, node_group_name=group, node_group_rank=rank, status=status, superseded=False,
                           ready_at=timezone.now() if ready else None, drain_at=timezone.now() if drain else None,
                           deployment_num=deployment, instance=SimpleNamespace(internal_ip=host, hostname=host))


def test_a_router_lists_the_ready_undrained_heads_of_the_other_groups_of_its_own_deployment():
    group = SimpleNamespace(name="router")
    router = _job(1, "router", deployment=2)
    jobs = [router, _job(2, "prefill", deployment=2), _job(3, "decode", deployment=2),
            _job(4, "decode", deployment=1), _job(5, "decode", deployment=2, drain=True),
            _job(6, "decode", deployment=2, ready=False), _job(7, "decode", deployment=2, rank=1),
            _job(8, "decode", deployment=2, status="terminating"), _job(9, "router", deployment=2)]
    assert [j.pk for j in workers_for(group, jobs, router)] == [2, 3]


def _entry(url, role, job=None, worker_id="w", **more):
    return {"id": worker_id, "url": url, "worker_type": role, **({"labels": {"muster.job": str(job)}} if job else {}),
            **more}


def test_the_difference_adds_what_is_missing_and_removes_what_is_extra_or_registered_otherwise():
    prefill = Registration(2, "http://10.0.0.2:8000", "prefill", 8998)
    decode = Registration(3, "http://10.0.0.3:8000", "decode")
    current = [
        _entry("http://10.0.0.2:8000", "prefill", 2, "a", bootstrap_port=8998),  # as wanted
        _entry("http://10.0.0.3:8000", "decode", 33, "b"),  # the same URL for an earlier job: replaced
        _entry("http://10.0.0.9:8000", "decode", None, "c"),  # nobody's
        _entry("http://10.0.0.8:8000", "decode", 8, "d", status="draining"),  # being removed already
    ]
    add, remove = diff(current, [prefill, decode])
    assert add == [decode] and [e["id"] for e in remove] == ["b", "c"]
    moved = [_entry("http://10.0.0.2:8000", "prefill", 2, "a", bootstrap_port=9999)]
    assert diff(moved, [prefill]) == ([prefill], moved), "another bootstrap port: registered again"
    assert diff([_entry("http://10.0.0.3:8000", "regular", 3)], [decode])[0] == [decode], "another role"
    assert diff([], []) == ([], [])
    assert listed_jobs(current, {3: "new"}) == {"2": "a", "33": "b", "8": "d", "3": "new"}


def test_a_registration_is_what_smg_takes():
    body = Registration(2, "http://10.0.0.2:8000", "prefill", 8998, "m").body()
    assert body == {"url": "http://10.0.0.2:8000", "worker_type": "prefill", "connection_mode": "http",
                    "runtime_type": "sglang", "labels": {"muster.job": "2"}, "bootstrap_port": 8998, "model_id": "m"}
    assert "bootstrap_port" not in Registration(3, "http://x:1", "decode", 8998).body()
