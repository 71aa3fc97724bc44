"""The caller's role in a project, read with the project in written SQL, and where a request keeps
the project its authentication already read (tokens.py reads it with the token's user, access.py
uses it). Its own module: tokens.py is imported while DRF loads its settings, before access.py's
imports (muster.api_errors, DRF's views) can be."""

from __future__ import annotations

from projects.models import Membership

# The request attribute: a (name, Project with caller_role, or None when there is no such project)
# pair, for the project the URL names.
READ_WITH_CALLER = "_muster_project_read"


def caller_role_sql(project: str, user: str) -> str:
    """The caller's role in a project as a scalar subquery (NULL: not a member), for written SQL
    whose row `project` is the project and whose `user` is the caller's id."""
    return f'(SELECT m.role FROM "{Membership._meta.db_table}" m WHERE m.project_id = {project}.id AND m.user_id = {user})'
