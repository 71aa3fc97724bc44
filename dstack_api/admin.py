from django.contrib import admin

from dstack_api.models import UserSSHKey


@admin.register(UserSSHKey)
class UserSSHKeyAdmin(admin.ModelAdmin):
    """Deleting a row makes the user a new keypair on their next dstack call (after a leak)."""

    list_display = ("user", "created")
    fields = ("user", "public_key", "created")
    readonly_fields = fields

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
