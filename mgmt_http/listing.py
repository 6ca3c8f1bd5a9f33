"""Listing query parameters as RabbitMQ's management API reads them (rabbit_mgmt_util).

``sort`` (a dotted path such as ``message_stats.publish_details.rate``, ties then in the listing's default
order) + ``sort_reverse``, ``page`` + ``page_size`` (answered in RabbitMQ's paged shape) with the ``name`` +
``use_regex`` filter of a page, and ``columns`` to keep only some fields.
"""
from __future__ import annotations

import gc
import math
import re
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator

from aiohttp import web

from amqp_server import patterns

from .http import HTTPError, bad_request, encode, encoded_response, json_response, query_is_true

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


Row = tuple[dict[str, Any], Any]  # (the fields filters and sorts read, the object to render, or None)


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def filter_by_name(rows: list[Row], pattern: str, use_regex: bool) -> list[Row]:
    """match_value: a case-insensitive regular expression, or a substring of the name, both lowercased as
    string:to_lower lowers their UTF-8 bytes (A-Z only, for any name that is valid UTF-8).  A pattern that is no
    regular expression is re:run's badarg, which with_valid_pagination answers as it answers a page that is no
    number (only once a row is matched: with none, nothing is refused)."""
    if use_regex:
        try:
            regex = patterns.compile(pattern, ignore_case=True)
        except patterns.Error:
            if not rows:
                return rows
            raise bad_request("Pagination parameters are invalid") from None
        return [row for row in rows if patterns.search(regex, str(row[0].get("name", "")))]
    pattern = pattern.translate(_ASCII_LOWER)
    return [row for row in rows if pattern in str(row[0].get("name", "")).translate(_ASCII_LOWER)]


def sort_items(rows: list[Row], keys: Iterable[str], reverse: bool) -> list[Row]:
    keys = list(keys)
    return sorted(rows, key=lambda row: tuple(_sort_key(lookup(row[0], key)) for key in keys), reverse=reverse)


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


_ERLANG_INTEGER = re.compile(r"[+-]?[0-9]+\Z")  # what list_to_integer/1 takes (Python's int() takes more)


def _query_integer(request: web.Request, name: str) -> int | None:
    """check_request_param: the parameter as list_to_integer/1 reads it, else 400 "Pagination parameters are
    invalid" (its badarg), whether or not a page is asked for."""
    raw = request.query.get(name)
    if raw is None:
        return None
    if not _ERLANG_INTEGER.match(raw):
        raise bad_request("Pagination parameters are invalid")
    return int(raw)


def _pagination(request: web.Request) -> tuple[int, int] | None:
    """pagination_params: (page, page_size) if a page is asked for, refused with RabbitMQ's errors: not
    integers, page < 1, size outside 1..500."""
    page, size = _query_integer(request, "page"), _query_integer(request, "page_size")
    if page is None:
        return None
    page_size = DEFAULT_PAGE_SIZE if size is None else size
    if page < 1 or not 1 <= page_size <= MAX_PAGE_SIZE:
        shown = "undefined" if size is None else size
        raise HTTPError(400, "invalid_pagination_parameters",
                        f"Invalid pagination parameters: page number {page}, page size {shown}")
    return page, page_size


def paginate(items: list[Any], page: int, page_size: int, total: int) -> dict[str, Any]:
    filtered = len(items)
    page_count = max(1, math.ceil(filtered / page_size)) if filtered else 0
    if page_count and page > page_count:
        raise HTTPError(400, "page_out_of_range",
                        f"Page out of range, page: {page} page size: {page_size}, len: {filtered}")
    chunk = items[(page - 1) * page_size:page * page_size]
    return {"filtered_count": filtered, "item_count": len(chunk), "items": chunk, "page": page,
            "page_count": page_count, "page_size": page_size, "total_count": total}


def respond(request: web.Request, items: list[Any], default_sort: tuple[str, ...] = ("vhost", "name"),
            render: Callable[[Any], dict[str, Any]] | None = None,
            stub: Callable[[Any], dict[str, Any]] | None = None) -> web.Response:
    """Filter, sort, page and trim a listing per the request's query, and answer it.

    ``items`` are JSON objects, or (with ``render``) objects rendered to JSON only when needed: given
    ``stub`` (an object's cheap fields, e.g. name and vhost), filtering and sorting by those fields work
    on the stubs, and a page renders only its own items.
    """
    with _collector_paused():
        body = _listing(request, items, default_sort, render, stub)
    return encoded_response(body)


def _listing(request: web.Request, items: list[Any], default_sort: tuple[str, ...],
             render: Callable[[Any], dict[str, Any]] | None,
             stub: Callable[[Any], dict[str, Any]] | None) -> bytes:
    query = request.query
    total = len(items)
    pagination = _pagination(request)
    sort = query.get("sort")
    keys = list(default_sort) if sort is None else [sort, *default_sort]  # merge_sorts: ties in the default order
    rows: list[Row]
    if render is not None and stub is not None and items and all(lookup(stub(items[0]), k) is not _MISSING
                                                                  for k in keys):
        rows = [(stub(item), item) for item in items]
    else:
        rows = [(render(item) if render is not None else item, None) for item in items]
    if pagination is not None and query.get("name"):  # maybe_filter_context: a page's only
        rows = filter_by_name(rows, query["name"], query_is_true(request, "use_regex"))
    if sort != "":  # sort_list: an empty sort leaves the listing as it is, unreversed
        rows = sort_items(rows, keys, _sort_reverse(request, rows))
    columns = [c.strip() for c in query.get("columns", "").split(",") if c.strip()]

    def finish(chosen: list[Row]) -> list[dict[str, Any]]:
        rendered = [fields if item is None or render is None else render(item) for fields, item in chosen]
        return [select_columns(item, columns) for item in rendered] if columns else rendered

    if pagination is None:
        return encode(finish(rows))
    paged = paginate(rows, *pagination, total)
    paged["items"] = finish(paged["items"])
    return encode(paged)


def _sort_reverse(request: web.Request, rows: list[Row]) -> bool:
    """get_sort_reverse: list_to_atom of the value, which maybe_reverse takes as true or false only; any other
    value crashes RabbitMQ's listing when it has items (a 500), refused here with a reason."""
    value = request.query.get("sort_reverse", "false")
    if value not in ("true", "false") and rows:
        raise bad_request(f"sort_reverse must be true or false, not {value!r}")
    return value == "true"


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Render and encode a listing without the cyclic GC: its tens of thousands of short-lived (acyclic) dicts
    would otherwise trigger full collections over the node's whole heap, 50-150 ms each with 1,000 queues.
    They are freed by reference counting (when ``_listing`` returns) before the collector is back, so its
    allocation counts are as they were before the request."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def respond_one(request: web.Request, item: dict[str, Any]) -> web.Response:
    columns = [c.strip() for c in request.query.get("columns", "").split(",") if c.strip()]
    return json_response(select_columns(item, columns) if columns else item)
