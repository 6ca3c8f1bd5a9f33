"""SQL filter expressions as RabbitMQ 4.2 reads and evaluates them (rabbit_amqp_filter_sql; the cases follow its
amqp_filter_sql_unit_SUITE): tokens, precedence, three-valued logic, types, LIKE with escapes, the limits, and a
LIKE matcher that agrees with a reference and stays linear on hostile patterns.  In process, no node."""
from __future__ import annotations

import re
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amqp_server.amqp1 import sql_filter
from amqp_server.amqp1.sql_filter import (InvalidExpression, Token, View, compile_expression, compile_like, parse,
                                         tokenize)
from stream_log import amqp10

proton = pytest.importorskip("proton")

APP = {"country": "UK", "city": "London", "description": "This is a test message", "product_id": "ABC_123",
       "weight": 5, "price": 10.5, "quantity": 100, "discount": 0.25, "temperature": -5, "score": 0,
       "distance": 1.2e6, "tiny_value": 3.5e-4, "active": True, "premium": False, "missing": None,
       "percentage": 75, "data": b"Hello", "signature": bytes.fromhex("DEADBEEF")}
PROPERTIES = ("id-123", b"\x0a\x0b\x0c", "to some queue", "some subject", "reply to some topic", 789, "text/plain",
              "deflate", 1311999988888, 1311704463521, "some group ID", 999, "other group ID")


def matches(expression: str, application: dict[str, Any] | None = None, priority: int = 4,
            properties: tuple[Any, ...] = (None,) * 13) -> bool:
    view = View(priority, properties, APP if application is None else application)
    return compile_expression(expression).matches(view)


def test_tokens():
    assert tokenize("p.subject LIKE 'a''%' AND [x y]<>0x0A0B OR h.priority>=-1.5E+2") == [
        Token("field", ("p", "subject")), Token("kw", "LIKE"), Token("str", "a'%"), Token("kw", "AND"),
        Token("field", ("a", "x y")), Token("op", "<>"), Token("bin", b"\x0a\x0b"), Token("kw", "OR"),
        Token("field", ("h", "priority")), Token("op", ">="), Token("op", "-"), Token("float", 150.0)]
    assert tokenize('a.k != "say ""hi""" AND [[[ x ]]] AND UTC ( )') == [
        Token("field", ("a", "k")), Token("op", "<>"), Token("str", 'say "hi"'), Token("kw", "AND"),
        Token("field", ("a", "[ x ]")), Token("kw", "AND"), Token("kw", "UTC"), Token("op", "("), Token("op", ")")]
    assert tokenize("TRUE\tFALSE\f42\r\n") == [Token("bool", True), Token("bool", False), Token("int", 42)]


def test_precedence_is_or_and_not_comparison_additive_multiplicative():
    a, b, c = ("field", "a", "a"), ("field", "a", "b"), ("field", "a", "c")
    assert parse("NOT a = 1 AND b OR c") == ("or", ("and", ("not", ("cmp", "=", a, ("lit", 1))), b), c)
    assert parse("a + b * c - 1 > 2") == \
        ("cmp", ">", ("arith", "-", ("arith", "+", a, ("arith", "*", b, c)), ("lit", 1)), ("lit", 2))
    assert parse("a % b % c") == ("arith", "%", ("arith", "%", a, b), c)
    assert parse("a IS NOT NULL") == ("not", ("null", a))
    assert parse("-(a) IN (1, b)") == ("in", ("neg", a), [("lit", 1), b])


@pytest.mark.parametrize("expression, expected", [
    # logic and NULL (Jakarta Messaging tables 3-4 to 3-6): unknown never matches, NOT unknown is unknown
    ("country = 'UK' AND weight = 5", True), ("NOT country = 'France'", True), ("missing AND premium", False),
    ("NOT absent", False), ("absent OR active", True), ("percentage OR active", True),
    ("NOT (absent IN ('v1', 'v2') AND active)", False), ("NOT (absent IN ('v1', 'v2') AND premium)", True),
    ("NOT (absent IN ('v1', 'v2') OR active)", False), ("NOT (NOT (premium OR absent IN ('v1')))", False),
    ("missing IS NULL", True), ("absent IS NULL", True), ("country IS NOT NULL", True), ("missing = missing", False),
    ("missing <> 0", False), ("0 != missing", False), ("missing OR FALSE", False),
    # comparison: numbers across types, strings and binaries by their bytes, unlike types FALSE
    ("country <> 'US'", True), ("country != 'UK'", False), ("'Zurich' > city", True), ("weight >= 5.0", True),
    ("weight >= 5.01", False), ("price >= 10", True), ("TRUE = 1", False), ("active = 1", False),
    ("NOT active = 'TRUE'", True), ("premium >= 0", False), ("country > 1", False), ("weight = '5'", False),
    ("data = 0x48656C6C6F", True), ("data = 'Hello'", True), ("signature IN (0xCAFEBABE, 0xDEADBEEF)", True),
    ("0xBB > 0xAA", True), ("weight = 0x05", False),
    # arithmetic: numbers only, / always exact, % Erlang's rem, division by zero unknown
    ("quantity * price * discount = 262.5", True), ("weight / 2 = 2.5", True), ("quantity / 10 = 10", True),
    ("7 % temperature = 2", True), ("-7 % 5 = -2", True), ("101 % percentage % weight = 1", True),
    ("quantity % score = 0", False), ("weight / 0 > 0", False), ("NOT weight / 0 > 0", False),
    ("price % 2 = 0.5", False), ("6 - -weight = 11", True), ("+weight", False), ("-city = 1", False),
    ("country + weight = 'UK5'", False), ("active + premium = 1", False),
    ("weight + weight * quantity - -temperature / 2 = 502.5", True), ("weight = -(-81) % percentage -1", True),
    ("NOT country = 'US' OR country = 'France' AND weight > 3", True),
    ("weight > 3 AND (price > 20 OR country = 'US')", False),
    # literals
    ("distance = 1.2E6", True), ("tiny_value = 3.5E-4", True), ("5.0E+2 = 500", True), ("0 = 0.0", True),
    ("\"UK\" = 'UK'", True), ("'UK''s' = \"UK's\"", True), ("TRUE", True), ("FALSE", False), ("active", True),
    # IN, LIKE
    ("'London' IN (city, country)", True), ("country NOT IN ('US', 'UK')", False), ("missing IN ('UK')", False),
    ("missing NOT IN ('UK')", False), ("description LIKE 'T_i% a %e_%e_sa%'", True),
    ("description LIKE 'T_i% a %e_%e_sa'", False), ("country LIKE 'U_'", True), ("country LIKE 'U_K'", False),
    ("product_id LIKE 'ABC\\_%' ESCAPE '\\'", True), ("product_id LIKE 'ABC\\%' ESCAPE '\\'", False),
    ("product_id LIKE 'ABC🥕_123' ESCAPE '🥕'", True), ("country NOT LIKE 'U%S'", True),
    ("absent NOT LIKE '%'", False), ("weight LIKE '5'", False), ("data LIKE 'He%'", True),
    # UTC()
    ("UTC() > 1000000000000 AND UTC ( ) < UTC() + 30000", True),
])
def test_evaluation(expression, expected):
    assert matches(expression) is expected


def test_like_escapes_and_wildcards():
    assert matches("key LIKE '_$%' ESCAPE '$'", {"key": "🥕%"})
    assert not matches("key LIKE '🍰@%🥕' ESCAPE '@'", {"key": "🍰other🥕"})
    assert matches("key LIKE '!_#.\\|()[]{} ^$*+?!%' ESCAPE '!'", {"key": "_#.\\|()[]{} ^$*+?%"})
    assert matches("food LIKE '%_🥕_%'", {"food": "car🥕rot"})
    assert not matches("food LIKE 'car__rot'", {"food": "car🥕rot"})
    assert matches("empty LIKE '%%%'", {"empty": ""}) and not matches("empty LIKE '_'", {"empty": ""})
    assert not matches("k LIKE '%'", {"k": b"\xff"}) and not matches("k NOT LIKE '%'", {"k": b"\xff"})


def test_fields_of_the_header_and_properties_sections():
    assert matches("h.priority = 4") and matches("header.priority > 5", priority=7)
    assert matches("p.message_id = 'id-123' AND p.user_id = 0x0A0B0C AND p.correlation_id > 500 AND "
                   "p.content_type LIKE 'text/%' AND p.absolute_expiry_time > 1311999988000 AND "
                   "properties.group_sequence % 3 = 0 AND p.reply_to_group_id <> p.group_id AND p.to IS NOT NULL",
                   properties=PROPERTIES)
    assert matches("p.subject IS NULL") and not matches("p.subject IS NOT NULL")
    assert matches("a.weight = 5 AND application_properties.weight = 5 AND [weight] = 5")
    assert matches("[properties.to] = 1", {"properties.to": 1})


def test_the_view_of_an_amqp_1_0_message_is_what_a_1_0_consumer_gets():
    record = proton.Message(body="b", priority=7, subject="s", group_id="g",
                            creation_time=1311704463.0, properties={"k": -3, "t": True, "b": b"\x01"}).encode()
    view = sql_filter.view_of(amqp10.Decoder("s", native=True).message(record))
    assert view is not None
    assert view.priority == 7
    assert view.properties[sql_filter.PROPERTY_FIELDS.index("subject")] == "s"
    assert view.properties[sql_filter.PROPERTY_FIELDS.index("creation_time")] == 1311704463000
    assert view.application == {"k": -3, "t": True, "b": b"\x01"}
    assert compile_expression("h.priority = 7 AND p.subject = 's' AND k < 0 AND t AND b = 0x01").matches(view)


@pytest.mark.parametrize("expression", [
    "not", "Not", "and", "true", "True", "null", "is", "like", "utc", "upper", "LOWER", "date", "exists", "nan",
    "INF", "my.key", "my$key", "$mykey", "_mykey", "1mykey", "[\n]", "[a[b]", "5. > 0", ".5 > 0", "5E2 > 0",
    "data = 0x", "data = 0x1", "data = 0x1a", "data = 0xG1", "data LIKE 0x48", "UTC(123)", "UTC", "header.invalid",
    "h.durable", "properties.invalid", "p.message-id = 1", "application-properties.foo = 'bar'", "d.abc", "m.abc",
    "f.abc", "delivery_annotations.abc", "AND NOT", "!!!", "FALSE FALSE", "a = b = c", "a BETWEEN 1 AND 2",
    "(a", "a)", "'open", "[open", "id LIKE 'pattern*' ESCAPE '*'", "id LIKE '\n'", "id LIKE '%\r'",
    "id LIKE '!\r' ESCAPE '!'", "id LIKE 'a' ESCAPE 'ab'", "UTC() IS NULL", "a NOT = 1", "1.0E999 > 0", "",
])
def test_what_rabbitmq_refuses(expression):
    with pytest.raises(InvalidExpression):
        parse(expression)


def test_limits_of_length_tokens_and_nesting():
    parse("x" * (4096 - 8) + " IS NULL")
    with pytest.raises(InvalidExpression, match="4096 characters"):
        parse("x" * 4096 + " IS NULL")
    parse("id IN (" + ", ".join(f"'{n}'" for n in range(98)) + ")")  # 199 tokens
    with pytest.raises(InvalidExpression, match="200 tokens"):
        parse("id IN (" + ", ".join(f"'{n}'" for n in range(100)) + ")")
    parse("(" * 32 + "TRUE" + ")" * 32)
    with pytest.raises(InvalidExpression, match="nested"):
        parse("(" * 33 + "TRUE" + ")" * 33)
    assert compile_expression("NOT " * 199 + "TRUE").matches(View(4, (None,) * 13, {})) is False


def test_a_filter_set_entry_is_read_under_either_descriptor():
    text = amqp10.Value("string", "TRUE")
    assert sql_filter.read(amqp10.Value("described", ("amqp:sql-filter", text))) is not None
    assert sql_filter.read(amqp10.Value("described", (0x120, text))) is not None
    assert sql_filter.read(amqp10.Value("described", ("apache.org:selector-filter:string", text))) is None
    assert sql_filter.read(amqp10.Value("described", (0x120, amqp10.Value("symbol", "TRUE")))) is None
    assert sql_filter.read(amqp10.Value("described", (0x120, amqp10.Value("string", "TRUE TRUE")))) is None


def _reference(pattern: str, escape: str | None, subject: str) -> bool:
    """LIKE by a regex (fine on small inputs): ``%`` any run, ``_`` one character, the escape making literal."""
    out, chars = [], iter(pattern)
    for char in chars:
        if char == escape:
            out.append(re.escape(next(chars)))
        else:
            out.append(".*" if char == "%" else "." if char == "_" else re.escape(char))
    return re.fullmatch("".join(out), subject, re.DOTALL) is not None


def _dangling(pattern: str, escape: str) -> bool:
    chars = iter(pattern)
    return any(char == escape and next(chars, None) is None for char in chars)


@settings(max_examples=400, deadline=None)
@given(st.text("ab%_!", max_size=10), st.text("ab%_", max_size=12))
def test_like_agrees_with_a_reference(pattern, subject):
    if _dangling(pattern, "!"):
        with pytest.raises(InvalidExpression):
            compile_like(pattern, "!")
    else:
        assert compile_like(pattern, "!")(subject) is _reference(pattern, "!", subject)


@settings(max_examples=50, deadline=None)
@given(st.integers(2, 100), st.sampled_from("XYZ"), st.integers(1, 500))
def test_many_percents_match_nothing_they_cannot(count, char, size):
    assert compile_like("%" * count + char, None)("a" * size) is False
    assert compile_like("%_" * count + char, None)("a" * size) is False


def _cpu(matcher: Any, subject: str) -> float:
    start = time.thread_time()
    matcher(subject)
    return time.thread_time() - start


def test_hostile_patterns_stay_linear():
    """``%_%_…%X`` against a long run of ``a``: a backtracking regex takes time exponential in the pattern; here
    it is linear in the subject (twice the subject, about twice the time) and small."""
    hostile = compile_like("%_" * 1000 + "X", None)
    assert not hostile("a" * 2000)
    small, large = _cpu(hostile, "a" * 20_000), _cpu(hostile, "a" * 80_000)
    assert large < 2.0, large
    assert large < 8 * small + 0.05, (small, large)
    segments = compile_like("%a" * 1000 + "%X", None)
    assert _cpu(segments, "a" * 100_000) < 1.0
