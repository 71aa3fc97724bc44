"""parse_probe_output: the probe script's key=value lines → the resources dict."""

from __future__ import annotations

import json
import subprocess

from backends.ssh.probe import PROBE_SCRIPT, parse_probe_output

BASE = """cpus=16
mem_kb=131927924
disk_kb=1056763904
arch=x86_64
ipv4=10.0.3.17/20
hostname_ip=10.0.3.17
python3=/usr/bin/python3
"""


def test_cpu_host_has_no_gpus_and_reports_size_and_network():
    result = parse_probe_output(BASE)
    assert result == {
        "cpus": 16,
        "memory_gb": 125.8,
        "disk_gb": 1007.8,
        "cpu_arch": "x86",
        "gpus": [],
        "tpu": None,
        "tpu_chips": 0,
        "internal_ip": "10.0.3.17",
        "network": "10.0.0.0/20",
        "python3": "/usr/bin/python3",
        "docker": None,
    }


def test_docker_is_recorded_with_its_version_and_runtimes_and_none_when_the_daemon_did_not_answer():
    answered = parse_probe_output(BASE + "docker=20.10.24+dfsg1|io.containerd.runc.v2,nvidia,runc,\n")
    assert answered["docker"] == {"version": "20.10.24+dfsg1", "runtimes": ["io.containerd.runc.v2", "nvidia", "runc"]}
    assert parse_probe_output(BASE + "docker=\n")["docker"] is None


def test_nvidia_lines_with_units_strip_the_vendor_prefix_and_convert_mib():
    text = BASE + "nvidia=NVIDIA L40S, 46068 MiB\nnvidia=NVIDIA L40S, 46068 MiB\n"
    assert parse_probe_output(text)["gpus"] == [{"name": "L40S", "memory_gb": 45.0, "vendor": "nvidia"}] * 2


def test_nvidia_lines_without_units_are_mib():
    text = BASE + "nvidia=NVIDIA H100 80GB HBM3, 81559\n"
    assert parse_probe_output(text)["gpus"] == [
        {"name": "H100 80GB HBM3", "memory_gb": 79.6, "vendor": "nvidia"}
    ]


def test_nvidia_error_text_is_not_a_gpu():
    text = BASE + "nvidia=NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"
    assert parse_probe_output(text)["gpus"] == []


def test_amd_static_json_list_with_value_unit_sizes():
    gpus = [
        {
            "gpu": i,
            "asic": {"market_name": "AMD Instinct MI300X", "vendor_id": "0x1002"},
            "vram": {"type": "HBM", "size": {"value": 196592, "unit": "MB"}},
        }
        for i in range(2)
    ]
    result = parse_probe_output(BASE + "amd_json=" + json.dumps(gpus) + "\n")
    assert result["gpus"] == [{"name": "MI300X", "memory_gb": 192.0, "vendor": "amd"}] * 2


def test_amd_static_json_wrapped_in_gpu_data_with_string_size():
    data = {"gpu_data": [{"gpu": 0, "asic": {"market_name": "MI250X"}, "vram": {"size": "65536 MB"}}]}
    result = parse_probe_output(BASE + "amd_json=" + json.dumps(data) + "\n")
    assert result["gpus"] == [{"name": "MI250X", "memory_gb": 64.0, "vendor": "amd"}]


def test_amd_list_only_counts_gpus():
    result = parse_probe_output(BASE + "amd_list=0\namd_list=1\namd_list=2\n")
    assert [g["vendor"] for g in result["gpus"]] == ["amd"] * 3


def test_tpu_chips_count_google_devices_only():
    text = (
        BASE.replace("x86_64", "x86_64")
        + "".join(f"tpu_dev=/dev/vfio/{n}:0x1ae0\n" for n in range(4))
        + "tpu_dev=/dev/vfio/9:0x8086\n"
    )
    result = parse_probe_output(text)
    assert result["tpu_chips"] == 4
    assert result["tpu"] is None
    assert result["gpus"] == []


def test_accel_nodes_of_an_nvidia_driver_are_not_tpu_chips():
    text = BASE + "nvidia=NVIDIA B200, 183359 MiB\ntpu_dev=/dev/accel0:\ntpu_dev=/dev/accel1:0x10de\n"
    assert parse_probe_output(text)["tpu_chips"] == 0


def test_accel_nodes_with_unknown_vendor_count_when_there_is_no_gpu():
    text = BASE + "tpu_dev=/dev/accel0:\ntpu_dev=/dev/accel1:\n"
    assert parse_probe_output(text)["tpu_chips"] == 2


def test_arm_host():
    assert parse_probe_output(BASE.replace("x86_64", "aarch64"))["cpu_arch"] == "arm"


def test_without_ip_command_uses_hostname_address_and_claims_no_network():
    text = "cpus=2\nhostname_ip=192.168.7.4\nhostname_ip=172.17.0.1\npython3=\n"
    result = parse_probe_output(text)
    assert (result["internal_ip"], result["network"], result["python3"]) == ("192.168.7.4", "", "")


def test_probe_script_is_posix_sh_and_runs_locally():
    # dash is a strict POSIX shell: a bashism in the script would fail here.
    proc = subprocess.run(["sh", "-n"], input=PROBE_SCRIPT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run(["sh", "-s"], input=PROBE_SCRIPT, capture_output=True, text=True, timeout=20)
    result = parse_probe_output(proc.stdout)
    assert result["cpus"] >= 1 and result["memory_gb"] > 0 and result["disk_gb"] > 0
