import logging

from django.apps import AppConfig

log = logging.getLogger("muster.security")


class ProjectsConfig(AppConfig):
    name = "projects"

    def ready(self) -> None:
        from django.conf import settings
        from django.db.models.signals import post_save

        from projects.api import schema  # noqa: F401  (registers the token scheme with drf-spectacular)
        from projects.services.members import on_user_saved

        post_save.connect(on_user_saved, sender=settings.AUTH_USER_MODEL, dispatch_uid="projects.claim_pending")

        if settings.PRODUCTION and settings.MUSTER.get("LOCAL_BACKEND"):
            log.warning("MUSTER_LOCAL_BACKEND is on in production: superusers can run commands on the control "
                        "plane's own machine as its user (docs/security.md)")
