"""Topic exchange: dot-separated pattern matching, semantics of rabbit_exchange_type_topic.

Keys split on '.', except that the empty string is zero words (so "#" matches "",
"" matches only "", and "a." is ["a", ""]).  In a binding key the whole word "*"
matches exactly one word and "#" zero or more; any other word is literal.
"""

from __future__ import annotations

from typing import Any

from cachetools import LRUCache

from .base import Binding, Exchange

ROUTE_CACHE_SIZE = 4096


def split_key(key: str) -> list[str]:
    return key.split(".") if key else []


class _Node:
    """Trie node; `dests` counts bindings whose key ends here, per destination."""

    __slots__ = ("children", "dests", "is_hash")

    def __init__(self, is_hash: bool) -> None:
        self.children: dict[str, _Node] = {}
        self.dests: dict[object, int] = {}
        self.is_hash = is_hash


class TopicExchange(Exchange):
    """Word trie shared by all bindings, plus an LRU of results per routing key.

    Publishers tend to reuse a small set of routing keys, so the cache turns most
    routes into one lookup; any binding change invalidates it wholesale.
    """

    __slots__ = ("_root", "_cache")

    type_name = "topic"

    @property
    def routes_each_key(self) -> bool:
        return True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._root = _Node(False)
        self._cache: LRUCache[str, frozenset] = LRUCache(ROUTE_CACHE_SIZE)

    def route(self, routing_key: str, message: Any) -> frozenset:
        cache = self._cache
        try:
            return cache[routing_key]
        except KeyError:
            pass
        result = cache[routing_key] = frozenset(self._match(split_key(routing_key)))
        return result

    def _match(self, words: list[str]) -> set[object]:
        """Walk states (node, words consumed), each at most once: O(nodes * words) for any key.

        A '#' node may absorb further words by staying put, so only '#' states have two ways in,
        and those alone are remembered.  A routing key's own '*' or '#' word takes no literal
        edge: the '*' edge is the same child, and a '#' child is reached as a wildcard anyway,
        and following both would visit states twice per level (2^words for a key of '*')."""
        result: set[object] = set()
        n = len(words)
        seen: set[tuple[int, int]] = set()
        stack: list[tuple[_Node, int]] = [(self._root, 0)]
        push = stack.append
        while stack:
            node, i = stack.pop()
            if node.is_hash and i < n:
                state = (id(node), i + 1)
                if state not in seen:
                    seen.add(state)
                    push((node, i + 1))
            children = node.children
            if i == n:
                result.update(node.dests)
            else:
                word = words[i]
                if word != "*" and word != "#":
                    child = children.get(word)
                    if child is not None:
                        push((child, i + 1))
                child = children.get("*")
                if child is not None:
                    push((child, i + 1))
            child = children.get("#")
            if child is not None:
                state = (id(child), i)
                if state not in seen:
                    seen.add(state)
                    push((child, i))
        return result

    def _invalidate(self) -> None:
        if self._cache:
            # Replacing beats LRUCache.clear(), which evicts entries one by one.
            self._cache = LRUCache(ROUTE_CACHE_SIZE)

    def _add(self, binding: Binding) -> None:
        node = self._root
        for word in split_key(binding.routing_key):
            child = node.children.get(word)
            if child is None:
                child = node.children[word] = _Node(word == "#")
            node = child
        dests = node.dests
        dests[binding.destination] = dests.get(binding.destination, 0) + 1
        self._invalidate()

    def _remove(self, binding: Binding) -> None:
        path = [self._root]
        words = split_key(binding.routing_key)
        for word in words:
            path.append(path[-1].children[word])
        dests = path[-1].dests
        n = dests[binding.destination] - 1
        if n:
            dests[binding.destination] = n
        else:
            del dests[binding.destination]
        # Prune nodes left with neither bindings nor children.
        for depth in range(len(words), 0, -1):
            node = path[depth]
            if node.dests or node.children:
                break
            del path[depth - 1].children[words[depth - 1]]
        self._invalidate()
