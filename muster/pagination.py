"""Pages of a list endpoint: the body stays a JSON list (clients written for the unpaged list keep
working on the first page), and the next page is a `Link: <url>; rel="next"` header (RFC 8288)."""

from __future__ import annotations

from rest_framework.exceptions import NotFound
from rest_framework.pagination import CursorPagination
from rest_framework.response import Response

from muster.api_errors import InvalidInput


class LinkHeaderCursorPagination(CursorPagination):
    """Newest first, by an opaque `cursor`: a run submitted while a client pages never shifts the
    pages it has not read yet (offsets would repeat or skip rows)."""

    page_size = 100
    max_page_size = 500
    page_size_query_param = "limit"
    page_size_query_description = f"runs per page (default {page_size}, at most {max_page_size})"
    cursor_query_description = "where the page starts: take it from the Link header's rel=\"next\" URL"
    ordering = ("-submitted_at", "-id")

    def get_page_size(self, request):
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        if not raw.isdigit() or not 1 <= int(raw) <= self.max_page_size:
            raise InvalidInput([self.page_size_query_param], f"a whole number from 1 to {self.max_page_size}")
        return int(raw)

    def decode_cursor(self, request):
        try:
            return super().decode_cursor(request)
        except NotFound:
            raise InvalidInput([self.cursor_query_param], "not a cursor of this list: follow the Link header's "
                                                          "rel=\"next\" URL, or leave it out for the first page") from None

    def get_paginated_response(self, data):
        links = []
        if (url := self.get_next_link()) is not None:
            links.append(f'<{url}>; rel="next"')
        if (url := self.get_previous_link()) is not None:
            links.append(f'<{url}>; rel="prev"')
        return Response(data, headers={"Link": ", ".join(links)} if links else None)

    def get_paginated_response_schema(self, schema):
        return schema
