from django.contrib import admin

from projects.models import Membership, Project, Secret


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["name", "created"]
    inlines = [MembershipInline]


@admin.register(Secret)
class SecretAdmin(admin.ModelAdmin):
    list_display = ["name", "project", "created"]
    fields = ["project", "name", "created"]
    readonly_fields = ["created"]
