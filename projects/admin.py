from django.contrib import admin

from projects.models import ApiToken, Membership, PendingMembership, Project, Secret


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


class PendingMembershipInline(admin.TabularInline):
    """Members added by a name no account has yet; they become members when it is created."""

    model = PendingMembership
    extra = 0


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["name", "created", "log_quota"]
    inlines = [MembershipInline, PendingMembershipInline]


@admin.register(Secret)
class SecretAdmin(admin.ModelAdmin):
    list_display = ["name", "project", "created"]
    fields = ["project", "name", "created"]
    readonly_fields = ["created"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens can be seen (by prefix) and deleted here; new ones come from `manage.py muster_token`."""

    list_display = ["prefix", "user", "created", "expires"]
    fields = ["prefix", "user", "created", "expires"]
    readonly_fields = ["prefix", "user", "created"]

    def has_add_permission(self, request):
        return False
