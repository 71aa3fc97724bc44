"""The running jobs' last usage samples (runs/usage.py) as Prometheus gauges, labelled by project,
run and job (and gpu): one series per running job, gone when the job ends."""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily


def usage_families(label_of):
    from runs.choices import JobStatus
    from runs.models import Job

    labels = ["project", "run", "job"]
    cpu = GaugeMetricFamily("muster_job_cpu_percent", "CPU use of a running job's processes on its host, in percent "
                            "of one core, as its runner last sampled it", labels=labels)
    memory = GaugeMetricFamily("muster_job_memory_bytes", "Memory of a running job's processes on its host",
                               labels=labels)
    gpu_util = GaugeMetricFamily("muster_job_gpu_utilization_percent", "Utilisation of each GPU of a running "
                                 "job's host, as nvidia-smi reports it", labels=[*labels, "gpu"])
    gpu_memory = GaugeMetricFamily("muster_job_gpu_memory_used_bytes", "Memory used on each GPU of a running "
                                   "job's host, as nvidia-smi reports it", labels=[*labels, "gpu"])
    rows = (Job.objects.filter(status=JobStatus.RUNNING, superseded=False)
            .values_list("run__project_id", "run__name", "job_num", "usage").order_by("run__name", "job_num"))
    for project_id, run, job_num, samples in rows:
        if not isinstance(samples, list) or not samples or not isinstance(samples[-1], dict):
            continue
        last, key = samples[-1], [label_of(project_id), run, str(job_num)]
        if last.get("cpu_percent") is not None:
            cpu.add_metric(key, last["cpu_percent"])
        if last.get("memory_bytes") is not None:
            memory.add_metric(key, last["memory_bytes"])
        for gpu in last.get("gpus") or []:
            if gpu.get("util_percent") is not None:
                gpu_util.add_metric([*key, str(gpu["index"])], gpu["util_percent"])
            if gpu.get("memory_used_bytes") is not None:
                gpu_memory.add_metric([*key, str(gpu["index"])], gpu["memory_used_bytes"])
    return [cpu, memory, gpu_util, gpu_memory]
