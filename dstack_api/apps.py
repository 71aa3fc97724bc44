from django.apps import AppConfig


class DstackApiConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "dstack_api"
    verbose_name = "dstack API"
