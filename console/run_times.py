"""Run duration and queue wait as Prometheus histograms, counted from the runs table at scrape time.

Queue wait is submit -> the first job running (Run.started_at); duration is submit -> the run's
end (Run.finished_at). Each is one grouped query over the runs that have the end point, so a
scrape costs the same whatever the workers do; a run deleted later leaves the counts (Prometheus
reads the drop as a counter reset).
"""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Count, DurationField, ExpressionWrapper, F, Q, Sum
from prometheus_client.core import HistogramMetricFamily

# seconds: a queue wait of a second on an idle local fleet up to a day's wait for a TPU slice
BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 3 * 3600, 12 * 3600, 24 * 3600)


def _histogram(name: str, doc: str, end_field: str, label_of) -> HistogramMetricFamily:
    from runs.models import Run

    family = HistogramMetricFamily(name, doc, labels=["project"])
    took = ExpressionWrapper(F(end_field) - F("submitted_at"), output_field=DurationField())
    per_bucket = {f"le_{i}": Count("id", filter=Q(took__lte=timedelta(seconds=b))) for i, b in enumerate(BUCKETS)}
    rows = (Run.objects.filter(**{f"{end_field}__isnull": False}).annotate(took=took).values("project_id")
            .annotate(n=Count("id"), total=Sum("took"), **per_bucket))
    merged: dict[str, list] = {}
    for row in rows:
        label = label_of(row["project_id"])
        counts = [row[f"le_{i}"] for i in range(len(BUCKETS))] + [row["n"]]
        seconds = row["total"].total_seconds() if row["total"] is not None else 0.0
        if label in merged:
            merged[label] = [[a + b for a, b in zip(merged[label][0], counts, strict=True)], merged[label][1] + seconds]
        else:
            merged[label] = [counts, seconds]
    for label, (counts, seconds) in sorted(merged.items()):
        buckets = [(str(float(b)), counts[i]) for i, b in enumerate(BUCKETS)] + [("+Inf", counts[-1])]
        family.add_metric([label], buckets, seconds)
    return family


def histograms(label_of):
    yield _histogram("muster_run_queue_wait_seconds", "Seconds from a run's submit to its first job running",
                     "started_at", label_of)
    yield _histogram("muster_run_duration_seconds", "Seconds from a run's submit to its end (done, failed or "
                     "terminated)", "finished_at", label_of)
