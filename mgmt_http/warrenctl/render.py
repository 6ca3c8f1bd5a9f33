"""Output for ``warrenctl``: rich tables per resource, raw JSON, one-line messages."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from rich.console import Console, JustifyMethod
from rich.table import Table

Row = dict[str, Any]


@dataclass(frozen=True)
class Column:
    title: str
    get: Callable[[Row], Any]
    justify: JustifyMethod = "left"


def field(key: str, title: str | None = None, justify: JustifyMethod = "left") -> Column:
    """A column showing ``row[key]``; dotted keys reach into nested objects."""
    def get(row: Row) -> Any:
        value: Any = row
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return value
    return Column(title or key, get, justify)


def number(key: str, title: str | None = None) -> Column:
    return field(key, title, "right")


def _tags(row: Row) -> str:
    tags = row.get("tags")
    return ",".join(tags) if isinstance(tags, list) else str(tags or "")


def _payload(row: Row) -> Any:
    """The payload on one line: control characters shown escaped."""
    payload = row.get("payload")
    if not isinstance(payload, str):
        return payload
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode() for ch in payload)


def _consumer_channel(row: Row) -> Any:
    return (row.get("channel_details") or {}).get("name")


def _connection_of_channel(row: Row) -> Any:
    return (row.get("connection_details") or {}).get("name")


COLUMNS: dict[str, list[Column]] = {
    "queues": [field("vhost"), field("name"), field("type"), field("durable"), field("auto_delete"),
               field("exclusive"), number("messages"), number("messages_ready", "ready"),
               number("messages_unacknowledged", "unacked"), number("consumers"), field("state"),
               field("arguments")],
    "exchanges": [field("vhost"), field("name"), field("type"), field("durable"), field("auto_delete"),
                  field("internal"), field("arguments")],
    "bindings": [field("vhost"), field("source"), field("destination"), field("destination_type"),
                 field("routing_key"), field("arguments")],
    "users": [field("name"), Column("tags", _tags)],
    "vhosts": [field("name"), number("messages"), field("tracing")],
    "permissions": [field("vhost"), field("user"), field("configure"), field("write"), field("read")],
    "policies": [field("vhost"), field("name"), field("pattern"), field("apply-to"), field("definition"),
                 number("priority")],
    "connections": [field("name"), field("user"), field("vhost"), field("peer_host"), number("peer_port"),
                    field("protocol"), number("channels"), field("state")],
    "channels": [field("name"), Column("connection", _connection_of_channel), number("number"),
                 field("user"), field("vhost"), number("consumer_count", "consumers"),
                 number("messages_unacknowledged", "unacked"), number("prefetch_count", "prefetch"),
                 field("confirm"), field("state")],
    "consumers": [field("queue.vhost", "vhost"), field("queue.name", "queue"), field("consumer_tag"),
                  Column("channel", _consumer_channel), field("ack_required"), field("exclusive"),
                  number("prefetch_count", "prefetch"), field("activity_status", "status"), field("arguments")],
    "messages": [field("routing_key"), field("exchange"), number("message_count", "remaining"),
                 field("redelivered"), number("payload_bytes", "bytes"), field("payload_encoding", "encoding"),
                 Column("payload", _payload), field("properties")],
    "peeked": [number("position"), field("routing_key"), field("exchange"), field("redelivered"),
               number("payload_bytes", "bytes"), field("payload_encoding", "encoding"),
               Column("payload", _payload), field("properties")],
}


COLUMNS["operator-policies"] = COLUMNS["policies"]


class Output:
    """Where results go: a rich console on stdout, errors on stderr."""

    def __init__(self, as_json: bool = False) -> None:
        self.as_json = as_json
        self.out = Console(soft_wrap=False, highlight=False)
        self.err = Console(stderr=True, highlight=False)

    def json(self, data: Any) -> None:
        # Plain write, not rich: JSON must stay parseable whatever the terminal width.
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n")

    def table(self, kind: str, rows: Iterable[Row], title: str | None = None, noun: str | None = None) -> None:
        rows = list(rows)
        if self.as_json:
            self.json(rows)
            return
        if not rows:
            self.out.print(f"[dim]no {noun or kind}[/dim]")
            return
        table = Table(title=title, title_justify="left", header_style="bold cyan")
        columns = COLUMNS[kind]
        for column in columns:
            table.add_column(column.title, justify=column.justify, overflow="fold")
        for row in rows:
            table.add_row(*(cell(column.get(row)) for column in columns))
        self.out.print(table)

    def ok(self, message: str, data: Any = None) -> None:
        """A successful change: a green line, or the API's answer with --json."""
        if self.as_json:
            self.json(data if data is not None else {"ok": True, "message": message})
        else:
            self.out.print(f"[green]{escape(message)}[/green]")

    def warn(self, message: str) -> None:
        self.err.print(f"[yellow]warrenctl: {escape(message)}[/yellow]")

    def error(self, message: str) -> None:
        # One line, plain text: scripts grep it.
        sys.stderr.write(f"warrenctl: {message}\n")

    def pairs(self, title: str, items: Iterable[tuple[str, Any]]) -> None:
        table = Table(title=title, title_justify="left", show_header=False, header_style="bold cyan")
        table.add_column(style="bold")
        table.add_column(overflow="fold")
        for key, value in items:
            table.add_row(key, cell(value))
        self.out.print(table)


def escape(text: str) -> str:
    return text.replace("[", r"\[")


def cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True) if value else ""
    return escape(str(value))
