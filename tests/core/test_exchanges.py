"""Unit tests for the exchanges package (routing only)."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exchanges import EXCHANGE_TYPES, Binding, Exchange, exchange_class
from exchanges.direct import DirectExchange
from exchanges.fanout import FanoutExchange
from exchanges.headers import HeadersExchange
from exchanges.topic import TopicExchange


class Msg:
    def __init__(self, headers=None):
        self.headers = headers


class Untouchable:
    @property
    def headers(self):
        raise AssertionError("headers must not be read")


NOMSG = Untouchable()


# --- registry / base -------------------------------------------------------

def test_registry():
    assert set(EXCHANGE_TYPES) == {"direct", "fanout", "topic", "headers", "x-consistent-hash",
                                   "x-delayed-message", "x-federation-upstream", "x-local-random"}
    assert exchange_class("topic") is TopicExchange
    assert exchange_class("x-nope") is None
    for name, cls in EXCHANGE_TYPES.items():
        assert issubclass(cls, Exchange) and cls.type_name == name


def test_exchange_attributes():
    x = DirectExchange("ex", durable=True, auto_delete=False, internal=True,
                       arguments={"alternate-exchange": "ae"})
    assert (x.name, x.durable, x.auto_delete, x.internal) == ("ex", True, False, True)
    assert x.arguments == {"alternate-exchange": "ae"}
    assert not hasattr(x, "__dict__")


def test_binding_identity_and_args():
    args = {"b": [1, {"z": 2}], "a": {"n": [3]}}
    x = DirectExchange("ex")
    assert x.bind("q", "k", args)
    assert not x.bind("q", "k", dict(reversed(list(args.items()))))
    assert x.bind("q", "k", {"a": 1})  # same key, different args: distinct
    assert x.bind("q", "k", None)
    assert not x.bind("q", "k", {})
    assert len(x) == 3 and x.has_bindings
    (b,) = [b for b in x.bindings() if len(b.arguments) == 2]
    assert isinstance(b, Binding) and b.source == "ex"
    assert b.args_dict() == args
    hash(b)
    assert x.route("k", NOMSG) == {"q"}
    assert x.unbind("q", "k", {"a": 1})
    assert not x.unbind("q", "k", {"a": 1})
    assert x.route("k", NOMSG) == {"q"}
    assert len(x.remove_destination("q")) == 2
    assert x.remove_destination("q") == []
    assert len(x) == 0 and not x.has_bindings
    assert x.route("k", NOMSG) == set()


# --- direct ----------------------------------------------------------------

def test_direct():
    x = DirectExchange("d")
    x.bind("q1", "a", {})
    x.bind("q2", "a", {})
    x.bind("q2", "a", {"x": 1})
    x.bind("q3", "b", {})
    assert x.route("a", NOMSG) == {"q1", "q2"}
    assert x.route("b", NOMSG) == {"q3"}
    assert x.route("c", NOMSG) == set()
    assert x.route("", NOMSG) == set()
    assert x.route("a", NOMSG) is x.route("a", NOMSG)  # shared, no allocation
    snapshot = x.route("a", NOMSG)
    x.unbind("q2", "a", {})
    assert x.route("a", NOMSG) == {"q1", "q2"}  # still bound via the {"x": 1} binding
    x.remove_destination("q2")
    assert x.route("a", NOMSG) == {"q1"}
    assert snapshot == {"q1", "q2"}  # handed-out results are immutable


def test_direct_exchange_destination():
    x, y = DirectExchange("d"), FanoutExchange("f")
    x.bind(y, "k", {})
    assert x.route("k", NOMSG) == {y}


# --- fanout ----------------------------------------------------------------

def test_fanout():
    x = FanoutExchange("f")
    assert x.route("any", NOMSG) == set()
    x.bind("q1", "", {})
    x.bind("q2", "ignored", {})
    x.bind("q2", "other", {})
    assert x.route("whatever", NOMSG) == {"q1", "q2"}
    x.unbind("q2", "ignored", {})
    assert x.route("", NOMSG) == {"q1", "q2"}
    x.unbind("q2", "other", {})
    assert x.route("", NOMSG) == {"q1"}


# --- headers ---------------------------------------------------------------

def test_headers_all_default():
    x = HeadersExchange("h")
    x.bind("q", "", {"a": 1, "b": "two"})
    assert x.route("", Msg({"a": 1, "b": "two", "c": 3})) == {"q"}
    assert x.route("", Msg({"a": 1})) == set()
    assert x.route("", Msg({"a": 1, "b": "other"})) == set()
    assert x.route("", Msg(None)) == set()
    assert x.route("", Msg({})) == set()


def test_headers_any():
    x = HeadersExchange("h")
    x.bind("q", "", {"x-match": "any", "a": 1, "b": 2})
    assert x.route("", Msg({"a": 1})) == {"q"}
    assert x.route("", Msg({"a": 0, "b": 2})) == {"q"}
    assert x.route("", Msg({"a": 0, "b": 0})) == set()
    assert x.route("", Msg(None)) == set()


def test_headers_x_arguments_ignored_unless_with_x():
    x = HeadersExchange("h")
    x.bind("all", "", {"x-match": "all", "x-k": 1, "a": 1})
    x.bind("any", "", {"x-match": "any", "x-k": 1})
    x.bind("all-x", "", {"x-match": "all-with-x", "x-k": 1, "a": 1})
    x.bind("any-x", "", {"x-match": "any-with-x", "x-k": 1, "a": 1})
    assert x.route("", Msg({"a": 1})) == {"all", "any-x"}
    assert x.route("", Msg({"a": 1, "x-k": 1})) == {"all", "all-x", "any-x"}
    assert x.route("", Msg({"x-k": 1})) == {"any-x"}
    # x-match itself never has to appear in the headers, even in -with-x modes.
    assert x.route("", Msg({"a": 1, "x-k": 1, "x-match": "nope"})) == {"all", "all-x", "any-x"}


def test_headers_empty_bindings():
    x = HeadersExchange("h")
    x.bind("all", "", {})
    x.bind("all2", "", {"x-match": "all", "x-ignored": 1})
    x.bind("any", "", {"x-match": "any"})
    # Only bindings that need headers read them.
    assert x.route("", NOMSG) == {"all", "all2"}
    assert x.route("", Msg(None)) == {"all", "all2"}


def test_headers_void_means_presence():
    x = HeadersExchange("h")
    x.bind("q", "", {"a": None})
    x.bind("r", "", {"x-match": "any", "a": None, "b": 5})
    assert x.route("", Msg({"a": "anything"})) == {"q", "r"}
    assert x.route("", Msg({"a": None})) == {"q", "r"}
    assert x.route("", Msg({"b": 5})) == {"r"}
    assert x.route("", Msg({"c": 1})) == set()


def test_headers_value_types():
    x = HeadersExchange("h")
    x.bind("q", "", {"flag": True, "n": 1, "t": {"k": [1, 2]}})
    assert x.route("", Msg({"flag": True, "n": 1, "t": {"k": [1, 2]}})) == {"q"}
    assert x.route("", Msg({"flag": 1, "n": 1, "t": {"k": [1, 2]}})) == set()
    assert x.route("", Msg({"flag": True, "n": True, "t": {"k": [1, 2]}})) == set()
    assert x.route("", Msg({"flag": True, "n": 1, "t": {"k": [2, 1]}})) == set()


def test_headers_invalid_x_match():
    x = HeadersExchange("h")
    with pytest.raises(ValueError) as err:
        x.bind("q", "", {"x-match": "foo"})
    assert str(err.value) == ('Invalid x-match field value <<"foo">>; '
                              "expected all, any, all-with-x, or any-with-x")
    with pytest.raises(ValueError, match="Invalid x-match field type long"):
        x.bind("q", "", {"x-match": 1})
    assert len(x) == 0 and x.route("", Msg({})) == set()


def test_headers_unbind_and_duplicates():
    x = HeadersExchange("h")
    x.bind("q", "", {"a": 1})
    x.bind("q", "", {"x-match": "any", "a": 1, "b": 1})
    assert x.route("", Msg({"a": 1})) == {"q"}
    assert x.unbind("q", "", {"a": 1})
    assert x.route("", Msg({"b": 1})) == {"q"}
    assert len(x.remove_destination("q")) == 1
    assert x.route("", Msg({"a": 1, "b": 1})) == set()


# --- topic -----------------------------------------------------------------

def reference_matches(binding_key: str, routing_key: str) -> bool:
    """Regex translation: every word, including the last, is followed by NUL."""
    def words(key):
        return key.split(".") if key else []
    parts = []
    for w in words(binding_key):
        if w == "#":
            parts.append("(?:[^\0]*\0)*")
        elif w == "*":
            parts.append("[^\0]*\0")
        else:
            parts.append(re.escape(w) + "\0")
    subject = "".join(w + "\0" for w in words(routing_key))
    return re.fullmatch("".join(parts), subject) is not None


def topic_routes(binding_key: str, routing_key: str) -> bool:
    x = TopicExchange("t")
    x.bind("q", binding_key, {})
    return "q" in x.route(routing_key, NOMSG)


RABBIT_EXAMPLES = [
    ("*.orange.*", "quick.orange.rabbit", True),
    ("*.orange.*", "lazy.orange.elephant", True),
    ("*.*.rabbit", "quick.orange.rabbit", True),
    ("*.*.rabbit", "lazy.brown.fox", False),
    ("lazy.#", "lazy.orange.elephant", True),
    ("lazy.#", "lazy", True),
    ("lazy.#", "lazy.pink.rabbit", True),
    ("*.orange.*", "quick.orange.male.rabbit", False),
    ("*.orange.*", "orange", False),
    ("#", "", True),
    ("#", "a.b.c", True),
    ("", "", True),
    ("", "a", False),
    ("*", "", False),
    ("*", "a", True),
    ("*", "a.b", False),
    ("a.#.b", "a.b", True),
    ("a.#.b", "a.x.y.b", True),
    ("a.#.b", "a.b.c", False),
    ("#.#", "", True),
    ("#.#", "a", True),
    ("#.*", "", False),
    ("#.*", "a.b", True),
    ("a.", "a.", True),
    ("a.", "a", False),
    ("a.*", "a.", True),
    (".", ".", True),
    ("*.*", ".", True),
    ("#", ".", True),
    ("*", ".", False),
    ("a.*.#", "a", False),
    ("a.*.#", "a.b", True),
    ("a*", "ab", False),
    ("a#", "a", False),
    ("a.#.#.b", "a.b", True),
]


@pytest.mark.parametrize("binding_key,routing_key,expected", RABBIT_EXAMPLES)
def test_topic_examples(binding_key, routing_key, expected):
    assert reference_matches(binding_key, routing_key) is expected
    assert topic_routes(binding_key, routing_key) is expected


WORD = st.sampled_from(["", "a", "b", "ab", "*", "#"])  # a routing key's '*' and '#' are literal words
PATTERN_WORD = st.sampled_from(["", "a", "b", "*", "#"])


def key_of(words):
    return ".".join(words)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.lists(PATTERN_WORD, max_size=5).map(key_of), min_size=1, max_size=8),
       st.lists(st.lists(WORD, max_size=6).map(key_of), min_size=1, max_size=8))
def test_topic_against_reference(binding_keys, routing_keys):
    x = TopicExchange("t")
    for i, bk in enumerate(binding_keys):
        x.bind(i, bk, {})
    for rk in routing_keys:
        expected = {i for i, bk in enumerate(binding_keys) if reference_matches(bk, rk)}
        assert x.route(rk, NOMSG) == expected
        assert x.route(rk, NOMSG) == expected  # cached
    # Unbinding half must invalidate the cache and prune correctly.
    for i, bk in enumerate(binding_keys):
        if i % 2:
            assert x.unbind(i, bk, {})
    for rk in routing_keys:
        expected = {i for i, bk in enumerate(binding_keys)
                    if not i % 2 and reference_matches(bk, rk)}
        assert x.route(rk, NOMSG) == expected
    for i, bk in enumerate(binding_keys):
        if not i % 2:
            assert x.unbind(i, bk, {})
    assert not x._root.children and not x._root.dests


def test_topic_refcounts_and_dedup():
    x = TopicExchange("t")
    x.bind("q", "a.*", {})
    x.bind("q", "a.#", {})
    x.bind("q", "a.*", {"v": 1})
    assert x.route("a.b", NOMSG) == {"q"}
    x.unbind("q", "a.*", {})
    x.unbind("q", "a.#", {})
    assert x.route("a.b", NOMSG) == {"q"}
    x.unbind("q", "a.*", {"v": 1})
    assert x.route("a.b", NOMSG) == set()


def test_topic_many_hashes_no_blowup():
    x = TopicExchange("t")
    x.bind("q", ".".join(["#"] * 30) + ".z", {})
    rk = ".".join(["w"] * 200)
    assert x.route(rk, NOMSG) == set()
    assert x.route(rk + ".z", NOMSG) == {"q"}


class _CountingChildren(dict):
    """A trie node's children that count lookups: the walk's cost, whatever the machine's speed."""
    lookups = 0

    def get(self, key, default=None):
        _CountingChildren.lookups += 1
        return super().get(key, default)


def _count_lookups(x: TopicExchange) -> None:
    stack = [x._root]
    while stack:
        node = stack.pop()
        node.children = _CountingChildren(node.children)
        stack.extend(node.children.values())
    _CountingChildren.lookups = 0


@pytest.mark.parametrize("binding_word,key_word", [("*", "*"), ("#", "#"), ("#", "*"), ("*", "#"), ("#", "a")])
def test_topic_walk_visits_each_state_once(binding_word, key_word):
    """A binding of D wildcards and a key of D literal '*' (or '#') words: each (node, words consumed) state is
    visited once (at most three lookups each), where following the '*' edge twice per level took 2^D steps."""
    depth = 16
    x = TopicExchange("t")
    x.bind("q", ".".join([binding_word] * depth), {})
    _count_lookups(x)
    assert x.route(".".join([key_word] * depth), NOMSG) == {"q"}
    nodes = depth + 1
    assert _CountingChildren.lookups <= 3 * nodes * (depth + 1)


def test_topic_key_of_127_stars_routes_at_once():
    """The longest key a publish carries (255 bytes: 128 '*' words) against a binding of the same: microseconds."""
    x = TopicExchange("t")
    key = ".".join(["*"] * 128)
    x.bind("q", key, {})
    start = time.perf_counter()
    assert x.route(key, NOMSG) == {"q"}
    assert time.perf_counter() - start < 0.5


def test_topic_10k_bindings():
    x = TopicExchange("t")
    n = 10_000
    for i in range(n):
        x.bind(f"q{i}", f"stock.{i % 100}.{'*' if i % 3 else '#'}.q{i}", {})
    x.bind("all", "#", {})
    start = time.perf_counter()
    for i in range(2_000):
        j = i % 300
        res = x.route(f"stock.{j % 100}.nyse.q{j}", NOMSG)
        assert "all" in res
    elapsed = time.perf_counter() - start
    assert x.route("stock.5.nyse.q5", NOMSG) == {"q5", "all"}
    assert x.route("stock.6.q6", NOMSG) == {"q6", "all"}  # '#' matches zero words
    print(f"2000 routes over {n} topic bindings: {elapsed * 1000:.1f} ms")
    assert len(x.remove_destination("q5")) == 1 and len(x) == n
