import logging

from django.apps import AppConfig

log = logging.getLogger("muster.security")


class ProjectsConfig(AppConfig):
    name = "projects"

    def ready(self) -> None:
        from django.conf import settings

        from projects.api import schema  # noqa: F401  (registers the token scheme with drf-spectacular)

        if settings.PRODUCTION and settings.MUSTER.get("LOCAL_BACKEND"):
            log.warning("MUSTER_LOCAL_BACKEND is on in production: superusers can run commands on the control "
                        "plane's own machine as its user (docs/security.md)")
