"""The projects app's hand-written statements: the reads every API request makes (the token's user,
the project its URL names with the caller's role there), as written SQL because the ORM spent three
times as long building and compiling each as the database spent answering it (docs/performance.md).

Column lists come from the models' `_meta`; rows become objects through muster.rows.from_row.
"""

from __future__ import annotations

import functools

from django.contrib.auth import get_user_model
from django.db import connection

from muster import rows
from projects.models import ApiToken, Membership, Project


def caller_role_sql(project: str, user: str) -> str:
    """The caller's role in a project as a scalar subquery (NULL: not a member), for written SQL
    whose row `project` is the project and whose `user` is the caller's id."""
    return (f'(SELECT m.role FROM "{Membership._meta.db_table}" m '
            f'WHERE m.project_id = {project}."{Project._meta.pk.column}" AND m.user_id = {user})')


def _token_join() -> str:
    user, token = get_user_model()._meta, ApiToken._meta
    return (f'FROM "{user.db_table}" u JOIN "{token.db_table}" t '
            f'ON t."{token.get_field("user").column}" = u."{user.pk.column}"')


def _usable() -> str:
    digest, expires = (f't."{ApiToken._meta.get_field(n).column}"' for n in ("digest", "expires"))
    return f"WHERE {digest} = %s AND ({expires} IS NULL OR {expires} > %s)"


@functools.cache
def _user_by_digest_sql() -> str:
    return f"SELECT {rows.column_list(get_user_model(), 'u')} {_token_join()} {_usable()}"


def _now(now):
    return connection.ops.adapt_datetimefield_value(now)


def user_by_digest(digest: str, now):
    """The user whose unexpired token has `digest` (active or not), or None."""
    found = rows.fetch_objects(get_user_model(), _user_by_digest_sql(), [digest, _now(now)])
    return found[0] if found else None


@functools.cache
def _user_and_project_sql() -> str:
    # _user_by_digest_sql with the project a URL names and the user's role in it, so a
    # project-scoped request reads both in one round trip; the columns are named, as the two
    # tables share names (id, name)
    user_id = f'u."{get_user_model()._meta.pk.column}"'
    return (f"SELECT {rows.column_list(get_user_model(), 'u')}, {rows.column_list(Project, 'p')}, "
            f"{caller_role_sql('p', user_id)} {_token_join()} "
            f'LEFT JOIN "{Project._meta.db_table}" p ON p."{_name()}" = %s {_usable()}')


def user_and_project(digest: str, now, name: str):
    """(user, project called `name` with the user's role in it as `caller_role`, or None when there
    is no such project), or None when no unexpired token has `digest`."""
    found = rows.fetch(_user_and_project_sql(), [name, digest, _now(now)])
    if not found:
        return None
    row = found[0]
    n = len(get_user_model()._meta.concrete_fields)
    user = rows.from_row(get_user_model(), row[:n])
    if row[n] is None:  # the project's id: no project of that name (the LEFT JOIN found none)
        return user, None
    return user, _with_role(rows.from_row(Project, row[n:-1]), row[-1])


@functools.cache
def _project_with_role_sql() -> str:
    return (f"SELECT {rows.column_list(Project, 'p')}, {caller_role_sql('p', '%s')} "
            f'FROM "{Project._meta.db_table}" p WHERE p."{_name()}" = %s')


def project_with_role(name: str, user_id: int | None) -> Project | None:
    """The project called `name` with the role of user `user_id` in it as `caller_role` (None: not a
    member), or None: one statement per request, not two."""
    found = rows.fetch(_project_with_role_sql(), [user_id, name])
    if not found:
        return None
    return _with_role(rows.from_row(Project, found[0][:-1]), found[0][-1])


def _name() -> str:
    return Project._meta.get_field("name").column


def _with_role(project: Project, role: str | None) -> Project:
    project.caller_role = role
    return project
