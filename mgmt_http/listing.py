"""Listing query parameters as RabbitMQ's management API reads them.

``name`` + ``use_regex`` filter, ``sort`` (a dotted path such as
``message_stats.publish_details.rate``) + ``sort_reverse``, ``page`` + ``page_size``
(answered in RabbitMQ's paged shape), and ``columns`` to keep only some fields.
"""
from __future__ import annotations

import math
import re
from typing import Any, Iterable

from aiohttp import web

from .http import HTTPError, bad_request, json_response, query_flag

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 500
_MISSING = object()


def lookup(item: dict[str, Any], path: str) -> Any:
    value: Any = item
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _sort_key(value: Any) -> tuple:
    """Mixed or missing values still sort: missing first, then numbers, then strings, then the rest."""
    if value is _MISSING or value is None:
        return (0, 0)
    if isinstance(value, bool):
        return (1, int(value))
    if isinstance(value, (int, float)):
        return (1, value)
    if isinstance(value, str):
        return (2, value)
    return (3, str(value))


def filter_by_name(items: list[dict[str, Any]], pattern: str, use_regex: bool) -> list[dict[str, Any]]:
    if use_regex:
        try:
            regex = re.compile(pattern, re.IGNORECASE)
        except re.error as exc:
            raise bad_request(f"invalid regular expression: {exc}") from None
        return [item for item in items if regex.search(str(item.get("name", "")))]
    return [item for item in items if pattern in str(item.get("name", ""))]


def sort_items(items: list[dict[str, Any]], keys: Iterable[str], reverse: bool) -> list[dict[str, Any]]:
    keys = list(keys)
    return sorted(items, key=lambda item: tuple(_sort_key(lookup(item, key)) for key in keys), reverse=reverse)


def select_columns(item: dict[str, Any], columns: list[str]) -> dict[str, Any]:
    """Only the named fields; a dotted column keeps the nested path."""
    result: dict[str, Any] = {}
    for column in columns:
        value = lookup(item, column)
        if value is _MISSING:
            continue
        parts = column.split(".")
        target = result
        for part in parts[:-1]:
            target = target.setdefault(part, {})
        target[parts[-1]] = value
    return result


def _pagination(request: web.Request) -> tuple[int, int]:
    """(page, page_size), refused with RabbitMQ's errors: not integers, page < 1, size outside 1..500."""
    raw_page, raw_size = request.query.get("page"), request.query.get("page_size")
    try:
        page = int(raw_page)
        page_size = int(raw_size) if raw_size is not None else DEFAULT_PAGE_SIZE
    except (TypeError, ValueError):
        raise bad_request("Pagination parameters are invalid") from None
    if page < 1 or not 1 <= page_size <= MAX_PAGE_SIZE:
        size = raw_size if raw_size is not None else "undefined"
        raise HTTPError(400, "invalid_pagination_parameters",
                        f"Invalid pagination parameters: page number {page}, page size {size}")
    return page, page_size


def paginate(items: list[dict[str, Any]], page: int, page_size: int, total: int) -> dict[str, Any]:
    filtered = len(items)
    page_count = max(1, math.ceil(filtered / page_size)) if filtered else 0
    if page_count and page > page_count:
        raise HTTPError(400, "page_out_of_range",
                        f"Page out of range, page: {page} page size: {page_size}, len: {filtered}")
    chunk = items[(page - 1) * page_size:page * page_size]
    return {"filtered_count": filtered, "item_count": len(chunk), "items": chunk, "page": page,
            "page_count": page_count, "page_size": page_size, "total_count": total}


def respond(request: web.Request, items: list[dict[str, Any]],
            default_sort: tuple[str, ...] = ("vhost", "name")) -> web.Response:
    """Filter, sort, page and trim a listing per the request's query, and answer it."""
    query = request.query
    total = len(items)
    if query.get("name"):
        items = filter_by_name(items, query["name"], query_flag(request, "use_regex"))
    sort = query.get("sort")
    keys = [sort] if sort else [key for key in default_sort]
    items = sort_items(items, keys, query_flag(request, "sort_reverse"))
    columns = [c.strip() for c in query.get("columns", "").split(",") if c.strip()]
    if "page" in query:
        page, page_size = _pagination(request)
        body = paginate(items, page, page_size, total)
        if columns:
            body["items"] = [select_columns(item, columns) for item in body["items"]]
        return json_response(body)
    if columns:
        items = [select_columns(item, columns) for item in items]
    return json_response(items)


def respond_one(request: web.Request, item: dict[str, Any]) -> web.Response:
    columns = [c.strip() for c in request.query.get("columns", "").split(",") if c.strip()]
    return json_response(select_columns(item, columns) if columns else item)
