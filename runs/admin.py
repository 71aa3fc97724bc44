from __future__ import annotations

import yaml
from django.contrib import admin, messages
from django.urls import reverse
from django.utils.html import format_html

from muster.claimable import LEASE_FIELDS
from runs.api.serializers import RunSerializer
from runs.models import Job, Run
from runs.services import logs, submitted_text
from runs.transitions import request_stop


def _all_fields(model) -> list[str]:
    return [f.name for f in model._meta.concrete_fields]


class JobInline(admin.TabularInline):
    model = Job
    extra = 0
    can_delete = False
    fields = ["node_group_name", "node_group_rank", "job_num", "submission_num", "status", "termination_reason",
              "instance", "instance_ip", "exit_status", "log_tail"]
    readonly_fields = fields
    ordering = ["-submission_num", "job_num"]

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("instance", "run")

    @admin.display(description="IP")
    def instance_ip(self, job: Job):
        return job.instance.internal_ip if job.instance else "-"

    @admin.display(description="log (tail)")
    def log_tail(self, job: Job):
        text = logs.read(job, 0)[-2000:].decode("utf-8", errors="replace")
        return format_html("<pre style='max-height:12em;overflow:auto'>{}</pre>", text) if text else "-"


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    """For operators: what a run is and its jobs, Stop and Abort, Delete only once it has ended.
    Nothing here edits a row the engine owns (status, leases, derived_at): the engine would act on a
    state no step produced."""

    list_display = ["name", "project", "status", "termination_reason", "fleet", "submission_num", "submitted_at",
                    "console_link"]
    list_filter = ["status", "fleet", "project"]
    search_fields = ["name"]
    exclude = ["configuration", *LEASE_FIELDS]
    inlines = [JobInline]
    actions = ["stop_runs", "abort_runs", "delete_finished_runs"]

    class Media:
        css = {"all": ["runs/admin.css"]}  # the list fits its column at 1280-1400 px

    def get_readonly_fields(self, request, obj=None):
        # the text as a block that keeps its indentation (a plain read-only field folds it to <br>s)
        shown = {"submitted_text": "submitted_text_shown"}
        return [shown.get(f, f) for f in _all_fields(Run) if f not in self.exclude] + [
            "configuration_as_submitted", "console_link"]

    def get_fields(self, request, obj=None):
        return self.get_readonly_fields(request, obj)

    def has_add_permission(self, request):
        return False  # runs are submitted through the API or the CLI, where they are validated

    def has_change_permission(self, request, obj=None):
        # read-only here: the page has nothing to save (Stop, Abort and Delete are the list's actions)
        return False

    def has_delete_permission(self, request, obj=None):
        if obj is not None and not obj.finished:
            return False
        return super().has_delete_permission(request, obj)

    def get_actions(self, request):
        actions = super().get_actions(request)
        # Django's bulk delete would take running runs with it: delete_finished_runs replaces it
        actions.pop("delete_selected", None)
        return actions

    @admin.display(description="Submitted text")
    def submitted_text_shown(self, run: Run):
        return format_html("<pre style='white-space:pre;overflow:auto;max-height:40em'>{}</pre>",
                           submitted_text.shown(run))

    @admin.display(description="configuration (as the API shows it)")
    def configuration_as_submitted(self, run: Run):
        text = yaml.safe_dump(RunSerializer().get_configuration(run), sort_keys=False)
        return format_html("<pre>{}</pre>", text)

    @admin.display(description="console")
    def console_link(self, run: Run):
        url = reverse("console:run", args=[run.project.name, run.name])
        return format_html('<a href="{}">picture, logs, events</a>', url)

    @admin.action(description="Stop selected runs")
    def stop_runs(self, request, queryset):
        for run in queryset:
            request_stop(run, abort=False, actor=request.user.username)
        messages.info(request, f"stop requested for {queryset.count()} runs")

    @admin.action(description="Abort selected runs")
    def abort_runs(self, request, queryset):
        for run in queryset:
            request_stop(run, abort=True, actor=request.user.username)
        messages.info(request, f"abort requested for {queryset.count()} runs")

    @admin.action(description="Delete selected runs that have ended", permissions=["delete"])
    def delete_finished_runs(self, request, queryset):
        active = [run.name for run in queryset if not run.finished]
        finished = [run.pk for run in queryset if run.finished]
        if active:
            messages.error(request, f"not deleted (still active; stop them first): {', '.join(sorted(active))}")
        if finished:
            Run.objects.filter(pk__in=finished).delete()
            messages.info(request, f"deleted {len(finished)} runs")
