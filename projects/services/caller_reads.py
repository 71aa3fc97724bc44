"""The project a token's authentication read with its user, handed to the views as `request.auth`.

A project-scoped request's token and project are read in one statement (projects/rows.py); the
authentication returns what it read as DRF's `auth` value, and the views take it through
`project_read` alone. Its own module: tokens.py is imported while DRF loads its settings, before
access.py's imports (muster.api_errors, DRF's views) can be.
"""

from __future__ import annotations

from dataclasses import dataclass

from projects.models import Project


@dataclass(frozen=True)
class ProjectRead:
    """`name`'s project with the caller's role in it as `caller_role`, or None: there is none."""

    name: str
    project: Project | None


def project_read(request, name: str) -> ProjectRead | None:
    """What the authentication of `request` read of the project called `name`; None when it read
    nothing of it (another authentication, a URL without a project, another project's name)."""
    read = getattr(request, "auth", None)
    return read if isinstance(read, ProjectRead) and read.name == name else None
