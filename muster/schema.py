"""The OpenAPI schema's grouping: each operation under the resource it acts on.

drf-spectacular tags an operation with the first segment of its path, which is `api` for every one
of Muster's, so /api/docs/ listed all of them under one heading. Here the tag is the resource: the
segment after the project (`runs` for /api/projects/{project}/runs/{name}/stop), or the first one
after /api/ when the path names no resource inside a project (`projects`, `memberships`).
"""

from __future__ import annotations

from drf_spectacular.openapi import AutoSchema

PROJECT = "{project}"


class MusterAutoSchema(AutoSchema):
    def get_tags(self) -> list[str]:
        segments = [s for s in self.path.strip("/").split("/") if s]
        if segments[:1] == ["api"]:
            segments = segments[1:]
        if segments[:1] == ["projects"] and segments[1:2] == [PROJECT] and len(segments) > 2:
            return [segments[2]]
        return segments[:1] or ["api"]
