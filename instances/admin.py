from __future__ import annotations

from django.contrib import admin, messages

from instances import lifecycle
from instances.models import Fleet, Instance, InstanceGroup
from muster.api_errors import InvalidInput


@admin.register(Fleet)
class FleetAdmin(admin.ModelAdmin):
    list_display = ["name", "project", "backend", "placement", "status", "network", "created"]
    list_filter = ["backend", "placement", "project"]
    exclude = ["private_key_encrypted"]


class InstanceInline(admin.TabularInline):
    model = Instance
    extra = 0
    can_delete = False
    fields = ["index", "name", "status", "internal_ip", "hostname"]
    readonly_fields = fields
    ordering = ["index"]

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(InstanceGroup)
class InstanceGroupAdmin(admin.ModelAdmin):
    list_display = ["name", "kind", "shape", "status", "fleet", "project", "created"]
    list_filter = ["kind", "status", "fleet"]
    inlines = [InstanceInline]
    actions = ["delete_whole_group"]
    exclude = ["lease_until", "lease_token"]

    @admin.action(description="Delete the whole group (a TPU pod: one delete call)")
    def delete_whole_group(self, request, queryset):
        for group in queryset:
            try:
                lifecycle.delete_group(group, actor=request.user.username)
            except InvalidInput as exc:
                messages.error(request, str(exc))
            else:
                messages.info(request, f"deleting {group.name}")


@admin.register(Instance)
class InstanceAdmin(admin.ModelAdmin):
    list_display = ["name", "group", "index", "status", "backend", "fleet", "internal_ip", "region", "unreachable"]
    list_filter = ["group", "backend", "status", "fleet"]
    search_fields = ["name", "hostname", "internal_ip"]
    ordering = ["group__name", "index", "name"]
    exclude = ["private_key_encrypted", "lease_until", "lease_token"]
