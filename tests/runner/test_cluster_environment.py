"""The cluster contract the runner hands to a job: MPI hostfile and environment
(docs/how-it-works.md, "The cluster environment")."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from .runner_helpers import job_spec, load_runner_module

mr = load_runner_module()

HOSTFILE = "/home/u/.muster/jobs/j/mpi/hostfile"


def spec_for(ips: list[str], gpus_per_node: list[int], gpus: int = 0, **overrides: Any) -> dict[str, Any]:
    cluster = {"job_ips": ips, "master_job_ip": ips[0] if ips else "", "gpus_per_node": gpus_per_node}
    return job_spec("j", ["true"], cluster_info=cluster, gpus=gpus, nodes_num=len(ips), **overrides)


class TestHostfile:
    def test_gpu_nodes_are_listed_with_their_slots(self):
        spec = spec_for(["10.0.0.2", "10.0.0.3"], [8, 4], gpus=8)
        assert mr.hostfile_content(spec) == "10.0.0.2 slots=8\n10.0.0.3 slots=4\n"

    def test_cpu_nodes_are_bare_ips_never_slots_zero(self):
        spec = spec_for(["10.0.0.2", "10.0.0.3"], [0, 0])
        content = mr.hostfile_content(spec)
        assert content == "10.0.0.2\n10.0.0.3\n"
        assert "slots=0" not in content

    def test_mixed_cpu_and_gpu_nodes_keep_rank_order(self):
        spec = spec_for(["10.0.0.2", "10.0.0.3", "10.0.0.4"], [0, 2, 2], gpus=0)
        assert mr.hostfile_content(spec) == "10.0.0.2\n10.0.0.3 slots=2\n10.0.0.4 slots=2\n"

    def test_empty_gpus_per_node_uses_this_jobs_gpu_count_for_every_node(self):
        spec = spec_for(["10.0.0.2", "10.0.0.3"], [], gpus=4)
        assert mr.hostfile_content(spec) == "10.0.0.2 slots=4\n10.0.0.3 slots=4\n"

    def test_empty_gpus_per_node_on_a_cpu_job_gives_bare_ips(self):
        spec = spec_for(["10.0.0.2", "10.0.0.3"], [], gpus=0)
        assert mr.hostfile_content(spec) == "10.0.0.2\n10.0.0.3\n"

    @pytest.mark.parametrize("ips", [["10.0.0.2", ""], ["", "10.0.0.3"], ["10.0.0.2", None]])
    def test_any_unknown_ip_gives_an_empty_file(self, ips):
        assert mr.hostfile_content(spec_for(ips, [2, 2], gpus=2)) == ""


class TestEnvironment:
    def env(self, spec: dict[str, Any], base: dict[str, str] | None = None) -> dict[str, str]:
        return mr.build_env(spec, base if base is not None else {"PATH": "/usr/bin"}, HOSTFILE)

    def test_sets_every_dstack_variable_from_the_spec(self):
        spec = spec_for(
            ["10.0.0.2", "10.0.0.3", "10.0.0.4"],
            [0, 2, 2],
            gpus=2,
            job_num=2,
            run_name="pd",
            node_group_name="decode",
            node_group_index=1,
            node_group_rank=1,
            node_ip="10.0.0.4",
        )
        env = self.env(spec)
        assert env["DSTACK_NODE_RANK"] == "2"
        assert env["DSTACK_JOB_NUM"] == "2"
        assert env["DSTACK_NODES_NUM"] == "3"
        assert env["DSTACK_NODES_IPS"] == "10.0.0.2\n10.0.0.3\n10.0.0.4"
        assert env["DSTACK_MASTER_NODE_IP"] == "10.0.0.2"
        assert env["DSTACK_GPUS_PER_NODE"] == "2"
        assert env["DSTACK_MPI_HOSTFILE"] == HOSTFILE
        assert env["DSTACK_RUN_NAME"] == "pd"
        assert env["DSTACK_NODE_GROUP_NAME"] == "decode"
        assert env["DSTACK_NODE_GROUP_INDEX"] == "1"
        assert env["DSTACK_NODE_GROUP_RANK"] == "1"
        assert env["DSTACK_NODE_IP"] == "10.0.0.4"

    def test_a_service_replicas_node_has_its_rank_within_the_replica(self):
        # a multi-host replica's jobs have run-wide job numbers; its rank space is its own
        spec = spec_for(["10.0.0.5", "10.0.0.6"], [], gpus=0, job_num=7, node_rank=1)
        env = self.env(spec)
        assert (env["DSTACK_NODE_RANK"], env["DSTACK_JOB_NUM"], env["DSTACK_NODES_NUM"]) == ("1", "7", "2")
        assert env["DSTACK_MASTER_NODE_IP"] == "10.0.0.5"

    def test_gpus_num_is_the_sum_of_a_mixed_cpu_gpu_list(self):
        env = self.env(spec_for(["a", "b", "c"], [0, 2, 2], gpus=0))
        assert env["DSTACK_GPUS_NUM"] == "4"

    def test_gpus_num_falls_back_to_nodes_times_gpus_without_gpus_per_node(self):
        env = self.env(spec_for(["a", "b", "c"], [], gpus=8))
        assert env["DSTACK_GPUS_NUM"] == "24"

    def test_hostfile_path_is_absolute(self):
        env = mr.build_env(spec_for(["a"], [0]), {}, "relative/hostfile")
        assert env["DSTACK_MPI_HOSTFILE"].startswith("/")
        assert env["DSTACK_MPI_HOSTFILE"].endswith("relative/hostfile")

    def test_keeps_the_runner_environment(self):
        env = self.env(spec_for(["a"], [0]), {"PATH": "/opt/bin", "HOME": "/home/u"})
        assert env["PATH"] == "/opt/bin"
        assert env["HOME"] == "/home/u"

    def test_user_env_wins_over_runner_and_cluster_variables(self):
        user_env = {"DSTACK_NODE_RANK": "99", "PATH": "/custom", "MY_VAR": "1", "PJRT_DEVICE": "CPU"}
        spec = spec_for(["a"], [0], env=user_env, tpu={"worker_id": 0, "worker_hostnames": "a"})
        env = self.env(spec)
        assert env["DSTACK_NODE_RANK"] == "99"
        assert env["PATH"] == "/custom"
        assert env["MY_VAR"] == "1"
        assert env["PJRT_DEVICE"] == "CPU"

    def test_user_env_values_become_strings(self):
        env = self.env(spec_for(["a"], [0], env={"PORT": 8000, "DEBUG": True}))
        assert env["PORT"] == "8000"
        assert env["DEBUG"] == "True"

    def test_tpu_hosts_get_worker_id_hostnames_and_pjrt_device(self):
        tpu = {"worker_id": 1, "worker_hostnames": "10.0.0.2,10.0.0.3"}
        env = self.env(spec_for(["10.0.0.2", "10.0.0.3"], [0, 0], tpu=tpu))
        assert env["TPU_WORKER_ID"] == "1"
        assert env["TPU_WORKER_HOSTNAMES"] == "10.0.0.2,10.0.0.3"
        assert env["PJRT_DEVICE"] == "TPU"

    def test_tpu_hostnames_given_as_a_list_are_comma_joined(self):
        tpu = {"worker_id": 0, "worker_hostnames": ["h0", "h1"]}
        assert self.env(spec_for(["h0", "h1"], [0, 0], tpu=tpu))["TPU_WORKER_HOSTNAMES"] == "h0,h1"

    def test_non_tpu_hosts_get_no_tpu_variables(self):
        env = self.env(spec_for(["a"], [0], tpu=None))
        assert not {"TPU_WORKER_ID", "TPU_WORKER_HOSTNAMES", "PJRT_DEVICE"} & env.keys()


class TestSpecValidation:
    @pytest.mark.parametrize(
        "spec",
        [
            [],
            {"commands": "echo hi"},
            {"commands": [1]},
            {"commands": [], "env": []},
            {"commands": [], "max_duration": "1h"},
        ],
    )
    def test_rejects_specs_it_cannot_run(self, spec):
        with pytest.raises(ValueError):
            mr.validate_spec(spec)

    def test_script_stops_at_the_first_failing_command(self):
        script = mr.job_script(["echo first", "sh -c 'exit 4'", "echo never"])
        result = subprocess.run(["/bin/sh", "-c", script], capture_output=True, check=False)
        assert (result.returncode, result.stdout) == (4, b"first\n")

    @pytest.mark.parametrize("job_id", ["", ".", "..", "a/b", "../x"])
    def test_job_ids_that_could_escape_the_jobs_directory_are_refused(self, job_id):
        with pytest.raises(ValueError):
            mr.Paths("/tmp/home").job(job_id)
