"""Which hosts a job's requirements fit, and how many GPUs it then uses there."""

from __future__ import annotations

from runs.configuration import fits, gpu_count_for, parse_resources


def host(
    cpus: int = 16,
    memory_gb: float = 64.0,
    disk_gb: float = 500.0,
    arch: str = "x86",
    gpus: list[dict] | None = None,
    tpu: str | None = None,
) -> dict:
    return {
        "cpus": cpus,
        "memory_gb": memory_gb,
        "disk_gb": disk_gb,
        "cpu_arch": arch,
        "gpus": gpus or [],
        "tpu": tpu,
    }


def l40s(n: int) -> list[dict]:
    return [{"name": "L40S", "memory_gb": 48.0, "vendor": "nvidia"} for _ in range(n)]


def needs(**written: object) -> dict:
    return parse_resources(written).as_dict()


CPU_HOST = host()
L40S_HOST = host(gpus=l40s(2))
TPU_HOST = host(cpus=96, memory_gb=300, tpu="v2-32")


def test_a_cpu_job_fits_a_cpu_host_and_uses_no_gpus() -> None:
    assert fits(needs(cpu=4), CPU_HOST)
    assert gpu_count_for(needs(cpu=4), CPU_HOST) == 0


def test_lower_bounds_filter_hosts() -> None:
    assert not fits(needs(cpu=32), CPU_HOST)
    assert not fits(needs(memory="128GB.."), CPU_HOST)
    assert not fits(needs(disk="1TB"), CPU_HOST)
    assert fits(needs(cpu="2..8", memory="..16GB"), CPU_HOST)


def test_a_job_without_gpu_requirement_fits_gpu_hosts_and_takes_their_gpus() -> None:
    assert fits(needs(), L40S_HOST)
    assert gpu_count_for(needs(), L40S_HOST) == 2


def test_a_gpu_job_never_fits_a_host_without_matching_gpus() -> None:
    assert not fits(needs(gpu="L40S"), CPU_HOST)
    assert not fits(needs(gpu="H100"), L40S_HOST)
    assert not fits(needs(gpu="L40S:4"), L40S_HOST)
    assert not fits(needs(gpu="amd:2"), L40S_HOST)
    assert not fits(needs(gpu="80GB"), L40S_HOST)


def test_gpu_names_match_whatever_the_case() -> None:
    lower = host(gpus=[{"name": "l40s", "memory_gb": 48.0, "vendor": "NVIDIA"}])
    assert fits(needs(gpu="L40S"), lower)
    assert fits(needs(gpu="l40s"), L40S_HOST)


def test_gpu_count_is_capped_by_the_requirement_max() -> None:
    assert fits(needs(gpu="L40S"), L40S_HOST)
    assert gpu_count_for(needs(gpu="L40S"), L40S_HOST) == 1
    assert gpu_count_for(needs(gpu="L40S:1.."), L40S_HOST) == 2
    assert gpu_count_for(needs(gpu="40GB..:1..2"), L40S_HOST) == 2


def test_a_zero_minimum_gpu_count_fits_cpu_hosts() -> None:
    assert fits(needs(gpu="..2"), CPU_HOST)
    assert fits(needs(gpu=0), CPU_HOST)
    assert gpu_count_for(needs(gpu=0), L40S_HOST) == 0


def test_cpu_architecture_must_match() -> None:
    arm_host = host(arch="arm", gpus=[{"name": "GH200", "memory_gb": 96.0, "vendor": "nvidia"}])
    assert fits(needs(gpu="GH200"), arm_host)
    assert not fits(needs(cpu=4), arm_host)
    assert not fits(needs(cpu="arm:4"), CPU_HOST)


def test_a_tpu_job_fits_only_its_slice() -> None:
    assert fits(needs(gpu="tpu-v2-32"), TPU_HOST)
    assert fits(needs(gpu="v2-32"), host(tpu="tpu-v2-32"))
    assert not fits(needs(gpu="v2-8"), TPU_HOST)
    assert not fits(needs(gpu="v2-32"), CPU_HOST)
    assert not fits(needs(gpu="v2-32"), L40S_HOST)


def test_a_job_without_tpu_requirement_does_not_fit_a_tpu_host() -> None:
    assert not fits(needs(), TPU_HOST)
    assert not fits(needs(gpu="L40S"), TPU_HOST)


def test_tpu_hosts_count_their_chips_per_host() -> None:
    assert gpu_count_for(needs(gpu="v2-32"), TPU_HOST) == 4
    assert gpu_count_for(needs(gpu="v6e-8"), host(tpu="v6e-8")) == 8
    assert gpu_count_for(needs(gpu="v5litepod-16"), host(tpu="v5litepod-16")) == 4


def test_gpu_total_memory_counts_the_memory_of_the_gpus_the_job_takes() -> None:
    # dstack's total_memory: two L40S give 96 GB, so 80GB.. fits and 100GB.. does not
    assert fits(needs(gpu={"name": "L40S", "count": "1..", "total_memory": "80GB.."}), L40S_HOST)
    assert not fits(needs(gpu={"name": "L40S", "count": "1..", "total_memory": "100GB.."}), L40S_HOST)
    # a count capped at one GPU takes 48 GB only
    assert not fits(needs(gpu={"count": "1", "total_memory": "80GB.."}), L40S_HOST)
