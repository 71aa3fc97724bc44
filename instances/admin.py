from __future__ import annotations

from django.contrib import admin, messages

from console import words
from instances.models import Fleet, Instance, InstanceGroup
from instances.services import groups
from muster.api_errors import InvalidInput
from muster.claimable import LEASE_FIELDS


def _all_fields(model, but=()) -> list[str]:
    return [f.name for f in model._meta.concrete_fields if f.name not in but]


class _ReadOnly(admin.ModelAdmin):
    """Fleets, groups and instances are made and changed by the API and the engine (which validate
    and act on them); the admin shows them and offers the operations that have a service function."""

    extra_readonly: tuple = ()

    def has_add_permission(self, request):
        return False

    def get_readonly_fields(self, request, obj=None):
        return _all_fields(self.model, self.exclude or ()) + list(self.extra_readonly)


@admin.register(Fleet)
class FleetAdmin(_ReadOnly):
    list_display = ["name", "project", "backend", "placement", "status", "network", "created"]
    list_filter = ["backend", "placement", "project"]
    exclude = ["private_key_encrypted"]


class InstanceInline(admin.TabularInline):
    model = Instance
    extra = 0
    can_delete = False
    fields = ["index", "name", "status", "health", "internal_ip", "hostname"]
    readonly_fields = fields
    ordering = ["index"]

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="health")
    def health(self, inst: Instance):
        return words.health(inst)


@admin.register(InstanceGroup)
class InstanceGroupAdmin(_ReadOnly):
    list_display = ["name", "kind", "shape", "status", "fleet", "project", "created"]
    list_filter = ["kind", "status", "fleet"]
    inlines = [InstanceInline]
    actions = ["delete_whole_group"]
    exclude = [*LEASE_FIELDS]

    def has_delete_permission(self, request, obj=None):
        return False  # the delete_whole_group action tears a group down through the backend

    @admin.action(description="Delete the whole group (a TPU pod: one delete call)")
    def delete_whole_group(self, request, queryset):
        for group in queryset:
            try:
                groups.delete_group(group, actor=request.user.username)
            except InvalidInput as exc:
                messages.error(request, str(exc))
            else:
                messages.info(request, f"deleting {group.name}")


@admin.register(Instance)
class InstanceAdmin(_ReadOnly):
    list_display = ["name", "group", "index", "status", "health", "backend", "fleet", "internal_ip", "region",
                    "gpus"]
    list_filter = ["group", "backend", "status", "fleet", "unreachable"]
    search_fields = ["name", "hostname", "internal_ip"]
    ordering = ["group__name", "index", "name"]
    exclude = ["private_key_encrypted", *LEASE_FIELDS]
    extra_readonly = ("health", "gpus")

    def has_delete_permission(self, request, obj=None):
        return False  # a row deleted here would leave its host (and a TPU VM's bill) behind

    @admin.display(description="health")
    def health(self, inst: Instance):
        return words.health(inst)

    @admin.display(description="GPUs")
    def gpus(self, inst: Instance):
        return words.gpus(inst)
