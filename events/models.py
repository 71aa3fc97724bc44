from __future__ import annotations

from django.db import models


class Event(models.Model):
    """One status change of a run, job, instance or fleet: when, who, and a sentence."""

    project = models.ForeignKey("projects.Project", on_delete=models.CASCADE, related_name="events")
    run = models.ForeignKey("runs.Run", null=True, blank=True, on_delete=models.CASCADE, related_name="events")
    job = models.ForeignKey("runs.Job", null=True, blank=True, on_delete=models.CASCADE, related_name="events")
    instance = models.ForeignKey(
        "instances.Instance", null=True, blank=True, on_delete=models.SET_NULL, related_name="events"
    )
    subject = models.CharField(max_length=128)  # "run pd", "job pd/2", "instance local-1"
    status = models.CharField(max_length=32, blank=True, default="")
    actor = models.CharField(max_length=64, default="server")
    message = models.TextField()
    created = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["created", "id"]

    def __str__(self) -> str:
        return f"{self.subject}: {self.message}"
