import logging

from django.apps import AppConfig
from django.conf import settings

log = logging.getLogger("muster.security")


def _create_cache_table(using="default", **kwargs) -> None:
    # the log-in throttle's table (settings.CACHES["login"]) is no model: every `migrate` makes it if missing
    from django.core.management import call_command

    call_command("createcachetable", database=using, verbosity=0)


class ProjectsConfig(AppConfig):
    name = "projects"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate, post_save

        from projects.api import schema  # noqa: F401  (registers the token scheme with drf-spectacular)
        from projects.services.members import on_user_saved

        post_save.connect(on_user_saved, sender=settings.AUTH_USER_MODEL, dispatch_uid="projects.claim_pending")

        post_migrate.connect(_create_cache_table, sender=self, dispatch_uid="muster-cache-table")

        if settings.PRODUCTION and settings.MUSTER["LOCAL_BACKEND"]:
            log.warning("MUSTER_LOCAL_BACKEND is on in production: superusers can run commands on the control "
                        "plane's own machine as its user (docs/security.md)")
