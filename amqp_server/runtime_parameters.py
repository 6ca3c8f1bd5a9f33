"""Runtime parameters by component (RabbitMQ's rabbit_runtime_parameters): the components Warren serves, and
RabbitMQ's refusal of any other, as a node without the plugin that registers it refuses it
(``Validation failed`` / ``component X not found``): a parameter is never kept for a feature that would not act
on it."""
from __future__ import annotations

from typing import Any

from . import federation, shovel
from .access_control import AccessControl, User
from .links import uri as uri_module

URI_KEYS = ("src-uri", "dest-uri", "uri")  # a shovel's, an upstream's


class ParameterError(ValueError):
    """RabbitMQ's validation message (``Validation failed\\n\\n...\\n``)."""


def _failed(errors: list[str]) -> ParameterError:
    return ParameterError("Validation failed\n\n" + "".join(f"{error}\n" for error in errors))


def _direct_users(access: AccessControl, value: dict[str, Any], user: User) -> list[str]:
    """RabbitMQ's validate_params_user: an ``amqp://`` URI (this node) is for a vhost the setter may use
    (rabbit_access_control:check_vhost_access: permissions there, an administrator's too); and, as
    RabbitMQ's direct connection checks no password, only an administrator may name another user in one."""
    errors: list[str] = []
    for key in URI_KEYS:
        if key not in value:
            continue
        for text in shovel.definition.uris(value[key]):
            parsed = uri_module.parse(text)
            if not parsed.direct:
                continue
            if not access.vhost_exists(parsed.vhost) or access.permissions(parsed.vhost, user.name) is None:
                errors.append(f"user \"{user.name}\" may not connect to vhost \"{parsed.vhost}\"")
            elif parsed.user not in (None, user.name) and "administrator" not in user.tags:
                errors.append(f"user \"{user.name}\" may not act as user \"{parsed.user}\" in \"{text}\"")
    return errors


def validate(access: AccessControl, component: str, name: str, value: Any, user: User | None) -> None:
    """Raise :class:`ParameterError` unless Warren serves ``component`` and ``value`` is valid for it; ``user`` is
    who sets it (None: a definitions import by an administrator)."""
    if component == shovel.COMPONENT:
        errors = shovel.validate(name, value)
    elif component in federation.COMPONENTS:
        errors = federation.validate(component, name, value)
    else:
        raise _failed([f"component {component} not found"])
    if not errors and user is not None and isinstance(value, dict):
        errors = _direct_users(access, value, user)
    if errors:
        raise _failed(errors)


def _redacted(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    return {key: ([uri_module.redacted(u) if isinstance(u, str) else u for u in item] if isinstance(item, list)
                  else uri_module.redacted(item))
            if key in URI_KEYS and isinstance(item, (str, list)) else item for key, item in value.items()}


def shown(record: dict[str, Any], full: bool) -> dict[str, Any]:
    """A parameter as the HTTP API lists it: without its URIs' credentials unless ``full`` (an administrator)."""
    value = record["value"]
    if not full:
        value = [_redacted(item) for item in value] if isinstance(value, list) else _redacted(value)
    return {"value": value, "vhost": record["vhost"], "component": record["component"], "name": record["name"]}
