from __future__ import annotations

from django.contrib import admin, messages
from django.utils.html import format_html

from runs import logs, stopping
from runs.models import Job, Run


class JobInline(admin.TabularInline):
    model = Job
    extra = 0
    can_delete = False
    fields = ["job_num", "submission_num", "node_group_name", "node_group_rank", "status", "termination_reason",
              "instance", "exit_status", "log_tail"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False

    @admin.display(description="log (tail)")
    def log_tail(self, job: Job):
        text = logs.read(job, 0)[-2000:].decode("utf-8", errors="replace")
        return format_html("<pre style='max-height:12em;overflow:auto'>{}</pre>", text) if text else "-"


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ["name", "project", "status", "termination_reason", "fleet", "submission_num", "submitted_at"]
    list_filter = ["status", "fleet", "project"]
    search_fields = ["name"]
    readonly_fields = ["project", "user", "name", "status", "termination_reason", "termination_message", "fleet",
                       "submission_num", "retry_attempts", "next_retry_at", "submitted_at", "finished_at",
                       "stop_requested"]
    exclude = ["configuration", "lease_until", "lease_token"]
    inlines = [JobInline]
    actions = ["stop_runs", "abort_runs"]

    @admin.action(description="Stop selected runs")
    def stop_runs(self, request, queryset):
        for run in queryset:
            stopping.request_stop(run, abort=False, actor=request.user.username)
        messages.info(request, f"stop requested for {queryset.count()} runs")

    @admin.action(description="Abort selected runs")
    def abort_runs(self, request, queryset):
        for run in queryset:
            stopping.request_stop(run, abort=True, actor=request.user.username)
        messages.info(request, f"abort requested for {queryset.count()} runs")
