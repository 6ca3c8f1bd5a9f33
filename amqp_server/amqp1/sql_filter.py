"""SQL filter expressions (AMQP Filter Expressions 1.0, §6), as RabbitMQ 4.2 reads and evaluates them for a
stream consumer (rabbit_amqp_filter_sql, rabbit_amqp_sql_lexer/parser): a condition such as
``p.subject LIKE 'order.%' AND region IN ('EMEA', 'APJ') AND h.priority > 4``.

The language RabbitMQ 4.2 takes: comparison (``= <> != < <= > >=``), ``AND OR NOT``, arithmetic
(``+ - * / %``, unary ``+ -``), ``IN (…)``, ``[NOT] LIKE '…' [ESCAPE '…']``, ``IS [NOT] NULL``, ``UTC()``;
integer, decimal (``1.5``, ``1.2E6``), string (``'…'`` or ``"…"``, a doubled quote escaping itself), binary
(``0x0A1B``) and boolean literals; fields ``header.priority``/``h.priority`` (4 when unset),
``properties.<field>``/``p.<field>`` (``message_id`` … ``reply_to_group_id``), and application properties by bare
name, ``application_properties.<name>``/``a.<name>`` or a delimited ``[any name]``.  Reserved words are upper
case; written otherwise they are not identifiers either.  NULL is SQL's unknown: comparison or arithmetic with it
is unknown, ``NOT`` unknown is unknown, and a message matches only when the condition is TRUE.  Values of unlike
types compare as FALSE; strings and binaries are both byte strings, as RabbitMQ's binaries are.

Every expression is hostile: at most ``MAX_LENGTH`` characters, ``MAX_TOKENS`` tokens and ``MAX_DEPTH`` nested
parentheses, parsed without backtracking; LIKE patterns are matched in time linear in the subject (a bit-parallel
automaton, never a backtracking regex: RabbitMQ's regex had a CVE for ``%_%_…%X`` patterns).
"""
from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from stream_log import amqp10
from stream_log.amqp10 import Value

if TYPE_CHECKING:
    from ..message import Message

DESCRIPTOR = ("amqp:sql-filter", 0x120)
FILTER_NAME = "sql-filter"  # the filter-set key RabbitMQ reads a SQL filter under
MAX_LENGTH = 4096  # characters
MAX_TOKENS = 200
MAX_DEPTH = 32  # parentheses nested in one another
DEFAULT_PRIORITY = 4
PROPERTY_FIELDS = ("message_id", "user_id", "to", "subject", "reply_to", "correlation_id", "content_type",
                   "content_encoding", "absolute_expiry_time", "creation_time", "group_id", "group_sequence",
                   "reply_to_group_id")
_SECTIONS = {"header": "h", "h": "h", "properties": "p", "p": "p", "application_properties": "a", "a": "a"}
_KEYWORDS = {"AND", "OR", "NOT", "LIKE", "IN", "IS", "NULL", "ESCAPE", "TRUE", "FALSE", "UTC"}
_RESERVED = _KEYWORDS | {"UPPER", "LOWER", "LEFT", "RIGHT", "SUBSTRING", "DATE", "EXISTS", "NAN", "INF"}
_WHITESPACE = " \t\f\n\r"
_OPERATORS = ("<>", "!=", "<=", ">=", "=", "<", ">", "+", "-", "*", "/", "%", "(", ")", ",")
_HEX = set("0123456789ABCDEF")


class InvalidExpression(ValueError):
    """Not a SQL filter expression RabbitMQ 4.2 takes."""


class Token(NamedTuple):
    kind: str  # op, kw, int, float, str, bin, bool, field
    value: Any


Node = tuple  # ("lit", v) ("field", section, name) ("utc",) ("and"|"or", a, b) ("not", a) ("cmp", op, a, b)
# ("arith", op, a, b) ("neg"|"pos", a) ("in", a, [items]) ("like", a, pattern, escape) ("null", a)


# -- tokens --------------------------------------------------------------------------------------------------------

def tokenize(text: str) -> list[Token]:
    """The tokens of an expression; InvalidExpression past ``MAX_LENGTH`` characters or ``MAX_TOKENS`` tokens."""
    if len(text) > MAX_LENGTH:
        raise InvalidExpression(f"longer than {MAX_LENGTH} characters")
    tokens: list[Token] = []
    pos, end = 0, len(text)
    while pos < end:
        char = text[pos]
        if char in _WHITESPACE:
            pos += 1
            continue
        if len(tokens) == MAX_TOKENS:
            raise InvalidExpression(f"more than {MAX_TOKENS} tokens")
        if char in "'\"":
            value, pos = _quoted(text, pos, char, char)
            tokens.append(Token("str", value))
        elif char == "[":
            name, pos = _quoted(text, pos, "[", "]")
            tokens.append(Token("field", ("a", name)))
        elif char.isdigit():
            token, pos = _numeral(text, pos)
            tokens.append(token)
        elif char.isascii() and char.isalpha():
            token, pos = _word(text, pos)
            tokens.append(token)
        else:
            operator = next((op for op in _OPERATORS if text.startswith(op, pos)), None)
            if operator is None:
                raise InvalidExpression(f"unexpected character {char!r} at {pos}")
            tokens.append(Token("op", "<>" if operator == "!=" else operator))
            pos += len(operator)
    return tokens


def _quoted(text: str, pos: int, opening: str, closing: str) -> tuple[str, int]:
    """A string (quotes) or delimited identifier (brackets) from ``pos``: a doubled delimiter stands for itself;
    an identifier holds no control character."""
    out: list[str] = []
    pos += 1
    while True:
        stop = text.find(closing, pos)
        if stop < 0:
            raise InvalidExpression(f"unterminated {opening}")
        chunk = text[pos:stop]
        if opening == "[":
            if any(ord(char) < 32 or ord(char) == 127 for char in chunk):
                raise InvalidExpression("control character in a delimited identifier")
            chunk = _brackets(chunk)
        out.append(chunk)
        if text.startswith(closing * 2, stop):
            out.append(closing)
            pos = stop + 2
            continue
        return "".join(out), stop + 1


def _brackets(chunk: str) -> str:
    """A delimited identifier's text between closing brackets: ``[[`` is one ``[``, a lone ``[`` an error."""
    out, pos = [], 0
    while (at := chunk.find("[", pos)) >= 0:
        if not chunk.startswith("[[", at):
            raise InvalidExpression("'[' in a delimited identifier must be doubled")
        out.append(chunk[pos:at + 1])
        pos = at + 2
    out.append(chunk[pos:])
    return "".join(out)


def _word_end(text: str, pos: int) -> int:
    while pos < len(text) and (text[pos].isascii() and (text[pos].isalnum() or text[pos] == "_")):
        pos += 1
    return pos


def _numeral(text: str, pos: int) -> tuple[Token, int]:
    """An integer, a decimal (digits on both sides of the point) with an optional exponent, or a binary
    constant (``0x`` and upper-case hex digit pairs)."""
    if text.startswith("0x", pos):
        end = _word_end(text, pos + 2)
        digits = text[pos + 2:end]
        if not digits or len(digits) % 2 or not set(digits) <= _HEX:
            raise InvalidExpression(f"bad binary constant {text[pos:end]!r}")
        return Token("bin", bytes.fromhex(digits)), end
    end = pos
    while end < len(text) and text[end].isdigit():
        end += 1
    kind = "int"
    if text.startswith(".", end):
        start = end = end + 1
        while end < len(text) and text[end].isdigit():
            end += 1
        if end == start:
            raise InvalidExpression("a decimal needs digits after its point")
        kind = "float"
        if end < len(text) and text[end] in "eE":
            exponent = end + 1 + (end + 1 < len(text) and text[end + 1] in "+-")
            end = exponent
            while end < len(text) and text[end].isdigit():
                end += 1
            if end == exponent:
                raise InvalidExpression("an exponent needs digits")
    if end < len(text) and (text[end].isalnum() or text[end] in "_."):
        raise InvalidExpression(f"bad number at {pos}")
    if kind == "int":
        return Token("int", int(text[pos:end])), end
    value = float(text[pos:end])
    if not math.isfinite(value):
        raise InvalidExpression("number out of range")
    return Token("float", value), end


def _word(text: str, pos: int) -> tuple[Token, int]:
    """A keyword, boolean, or field reference (``name`` or ``section.name``, the name plain or delimited)."""
    end = _word_end(text, pos)
    word = text[pos:end]
    if not text.startswith(".", end):
        if word.upper() in _RESERVED:
            if word not in _KEYWORDS:
                raise InvalidExpression(f"reserved word {word!r} (reserved words are upper case)")
            if word in ("TRUE", "FALSE"):
                return Token("bool", word == "TRUE"), end
            return Token("kw", word), end
        return Token("field", ("a", word)), end
    section = _SECTIONS.get(word)
    if section is None:
        raise InvalidExpression(f"unknown section {word!r}")
    pos = end + 1
    if section == "a" and text.startswith("[", pos):
        name, end = _quoted(text, pos, "[", "]")
    else:
        end = _word_end(text, pos)
        name = text[pos:end]
        if not name or not name[0].isalpha():
            raise InvalidExpression(f"bad field name after {word!r}")
    if section == "h" and name != "priority":
        raise InvalidExpression(f"header field {name!r} (only priority is read)")
    if section == "p" and name not in PROPERTY_FIELDS:
        raise InvalidExpression(f"{name!r} is not a field of properties")
    return Token("field", (section, name)), end


# -- parser (recursive descent, in RabbitMQ's precedence: OR < AND < NOT < comparison < + - < * / % < unary) --------

class _Parser:
    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.at = 0
        self.depth = 0

    def peek(self) -> Token | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def accept(self, kind: str, value: Any = None) -> Token | None:
        token = self.peek()
        if token is not None and token.kind == kind and (value is None or token.value == value):
            self.at += 1
            return token
        return None

    def expect(self, kind: str, value: Any = None) -> Token:
        token = self.accept(kind, value)
        if token is None:
            raise InvalidExpression(f"expected {value or kind} at token {self.at}")
        return token

    def condition(self) -> Node:
        node = self.conjunction()
        while self.accept("kw", "OR"):
            node = ("or", node, self.conjunction())
        return node

    def conjunction(self) -> Node:
        node = self.negation()
        while self.accept("kw", "AND"):
            node = ("and", node, self.negation())
        return node

    def negation(self) -> Node:
        count = 0
        while self.accept("kw", "NOT"):
            count += 1
        node = self.comparison()
        for _ in range(count):
            node = ("not", node)
        return node

    def comparison(self) -> Node:
        left = self.additive()
        token = self.peek()
        if token is None:
            return left
        if token.kind == "op" and token.value in ("=", "<>", "<", "<=", ">", ">="):
            self.at += 1
            return ("cmp", token.value, left, self.additive())
        if token == Token("kw", "IS"):
            self.at += 1
            negated = self.accept("kw", "NOT") is not None
            self.expect("kw", "NULL")
            if left[0] != "field":
                raise InvalidExpression("IS NULL applies to a field")
            return ("not", ("null", left)) if negated else ("null", left)
        negated = self.accept("kw", "NOT") is not None
        if self.accept("kw", "LIKE"):
            node = self.like(left)
        elif self.accept("kw", "IN"):
            self.expect("op", "(")
            items = [self.additive()]
            while self.accept("op", ","):
                items.append(self.additive())
            self.expect("op", ")")
            node = ("in", left, items)
        elif negated:
            raise InvalidExpression("NOT must be followed by LIKE or IN here")
        else:
            return left
        return ("not", node) if negated else node

    def like(self, subject: Node) -> Node:
        pattern = self.expect("str").value
        escape = None
        if self.accept("kw", "ESCAPE"):
            escape = self.expect("str").value
            if len(escape) != 1:
                raise InvalidExpression("ESCAPE must be a single character")
        return ("like", subject, compile_like(pattern, escape))

    def additive(self) -> Node:
        node = self.multiplicative()
        while (token := self.peek()) is not None and token.kind == "op" and token.value in ("+", "-"):
            self.at += 1
            node = ("arith", token.value, node, self.multiplicative())
        return node

    def multiplicative(self) -> Node:
        node = self.unary()
        while (token := self.peek()) is not None and token.kind == "op" and token.value in ("*", "/", "%"):
            self.at += 1
            node = ("arith", token.value, node, self.unary())
        return node

    def unary(self) -> Node:
        if self.accept("op", "-"):
            return ("neg", self.primary())
        if self.accept("op", "+"):
            return ("pos", self.primary())
        return self.primary()

    def primary(self) -> Node:
        token = self.peek()
        if token is None:
            raise InvalidExpression("unexpected end")
        self.at += 1
        if token == Token("op", "("):
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise InvalidExpression(f"more than {MAX_DEPTH} nested parentheses")
            node = self.condition()
            self.expect("op", ")")
            self.depth -= 1
            return node
        if token.kind in ("int", "float", "str", "bin", "bool"):
            return ("lit", token.value)
        if token.kind == "field":
            return ("field", *token.value)
        if token == Token("kw", "UTC"):
            self.expect("op", "(")
            self.expect("op", ")")
            return ("utc",)
        raise InvalidExpression(f"unexpected {token.value!r}")


def parse(text: str) -> Node:
    """The syntax tree of an expression; InvalidExpression if RabbitMQ 4.2 would not take it."""
    parser = _Parser(tokenize(text))
    node = parser.condition()
    if parser.peek() is not None:
        raise InvalidExpression(f"unexpected {parser.peek().value!r} at token {parser.at}")  # type: ignore[union-attr]
    return node


# -- LIKE, linear in the subject -------------------------------------------------------------------------------------

_ANY = object()  # ``_``
_RUN = object()  # ``%``


def compile_like(pattern: str, escape: str | None) -> Callable[[str], bool]:
    """A matcher of ``pattern`` (``_`` one character, ``%`` any run, ``escape`` making the next one literal) that
    runs in time linear in its subject: literal-only and ``%``-only patterns by string search, others by a
    bit-parallel automaton (one bit a pattern position)."""
    items: list[Any] = []
    chars = iter(pattern)
    for char in chars:
        if ord(char) < 32 or ord(char) == 127:
            raise InvalidExpression("control character in a LIKE pattern")
        if char == escape:
            char = next(chars, "")
            if not char:
                raise InvalidExpression("LIKE pattern ends with its escape character")
            if ord(char) < 32 or ord(char) == 127:
                raise InvalidExpression("control character in a LIKE pattern")
            items.append(char)
        elif char == "%":
            if not items or items[-1] is not _RUN:
                items.append(_RUN)
        else:
            items.append(_ANY if char == "_" else char)
    if _ANY not in items:
        return _segments(items)
    return _automaton(items)


def _segments(items: list[Any]) -> Callable[[str], bool]:
    """A pattern of literals and ``%``: its literal runs, leftmost-first (which finds a match if there is one)."""
    parts = "".join(_RUN_MARK if item is _RUN else item for item in items).split(_RUN_MARK)
    if len(parts) == 1:
        exact = parts[0]
        return lambda subject: subject == exact
    head, middle, tail = parts[0], parts[1:-1], parts[-1]
    least = len(head) + len(tail) + sum(map(len, middle))

    def matches(subject: str) -> bool:
        if len(subject) < least or not subject.startswith(head) or not subject.endswith(tail):
            return False
        pos, stop = len(head), len(subject) - len(tail)
        for part in middle:
            found = subject.find(part, pos, stop)
            if found < 0:
                return False
            pos = found + len(part)
        return True
    return matches


_RUN_MARK = "\x00"  # (control characters never reach a pattern's items)


def _automaton(items: list[Any]) -> Callable[[str], bool]:
    """Shift-And over the pattern's positions: bit i set when the first i items match the text read so far; a
    ``%`` item's bit loops on any character and is reached without one (consecutive ``%`` were merged)."""
    runs = 0
    anything = 0
    by_char: dict[str, int] = {}
    for index, item in enumerate(items, 1):
        bit = 1 << index
        if item is _RUN:
            runs |= bit
        elif item is _ANY:
            anything |= bit
        else:
            by_char[item] = by_char.get(item, 0) | bit
    by_char = {char: bits | anything for char, bits in by_char.items()}
    accept = 1 << len(items)
    start = 1 | ((1 << 1) & runs)

    def matches(subject: str) -> bool:
        state = start
        get = by_char.get
        for char in subject:
            state = ((state << 1) & get(char, anything)) | (state & runs)
            state |= (state << 1) & runs
            if not state:
                return False
        return bool(state & accept)
    return matches


# -- evaluation ------------------------------------------------------------------------------------------------------

class View(NamedTuple):
    """What an expression reads of a message: the header's priority, the 13 properties, the application
    properties (each as a plain value: str, bytes, int, float, bool, None)."""

    priority: int
    properties: tuple[Any, ...]
    application: dict[str, Any]


Evaluate = Callable[[View], Any]


def _plain(value: Value) -> Any:
    kind = value.kind
    if kind in ("string", "symbol", "binary", "bool", "float", "double", "timestamp") or kind in _INTEGERS:
        return value.value
    if kind == "uuid":
        return value.value.bytes
    if kind == "char":
        return chr(value.value) if value.value < 0x110000 else None
    return None  # null, and what SQL cannot compare (lists, maps, arrays, decimals, described values)


_INTEGERS = ("ubyte", "byte", "ushort", "short", "uint", "int", "ulong", "long")
_VIEWS: amqp10.Memo[bytes, View] = amqp10.Memo(amqp10.SHARED_MEMO)  # by the envelope they were read from


def view_of(message: Message) -> View | None:
    """The message as an AMQP 1.0 consumer would get it (the same conversion), decoded once per distinct
    envelope (the envelope is itself remembered per route and header); None if it cannot be read."""
    envelope = amqp10.record_parts(message, True)[0]
    view = _VIEWS.get(envelope)
    if view is not None:
        return view
    priority, properties, application = DEFAULT_PRIORITY, (None,) * len(PROPERTY_FIELDS), {}
    try:
        found = amqp10.sections(envelope, amqp10.MESSAGE_ANNOTATIONS)
    except (amqp10.Invalid, amqp10.TooLarge):
        return None
    for descriptor, content, _ in found:
        if content.kind == "list" and descriptor == amqp10.HEADER:
            fields = content.value
            if len(fields) > 1 and fields[1].kind == "ubyte":
                priority = fields[1].value
        elif content.kind == "list" and descriptor == amqp10.PROPERTIES:
            values = [_plain(field) for field in content.value[:len(PROPERTY_FIELDS)]]
            properties = tuple(values + [None] * (len(PROPERTY_FIELDS) - len(values)))
        elif content.kind == "map" and descriptor == amqp10.APPLICATION_PROPERTIES:
            application = {key.value: _plain(item) for key, item in content.value if key.kind == "string"}
    return _VIEWS.put(envelope, View(priority, properties, application), len(envelope))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _text(value: Any) -> bool:
    return isinstance(value, (str, bytes))


def _same(left: Any, right: Any) -> bool:
    """Erlang's ``==`` on the values RabbitMQ compares: numbers across their types, strings and binaries as
    the bytes they are, anything else only with its own type."""
    if isinstance(left, bool) or isinstance(right, bool):
        return left is right
    if _number(left) and _number(right):
        return bool(left == right)
    if isinstance(left, str) and isinstance(right, bytes):
        return left.encode() == right
    if isinstance(left, bytes) and isinstance(right, str):
        return left == right.encode()
    return type(left) is type(right) and bool(left == right)


def _order(op: str, left: Any, right: Any) -> bool:
    if _number(left) and _number(right):
        pass
    elif _text(left) and _text(right):
        if type(left) is not type(right):
            left = left.encode() if isinstance(left, str) else left
            right = right.encode() if isinstance(right, str) else right
    else:
        return False  # unlike types: FALSE (not unknown)
    if op == "<":
        return bool(left < right)
    if op == "<=":
        return bool(left <= right)
    if op == ">":
        return bool(left > right)
    return bool(left >= right)


def _compare(op: str, left: Any, right: Any) -> bool | None:
    if left is None or right is None:
        return None
    if op == "=":
        return _same(left, right)
    if op == "<>":
        return not _same(left, right)
    return _order(op, left, right)


def _arithmetic(op: str, left: Any, right: Any) -> Any:
    if not (_number(left) and _number(right)):
        return None
    try:
        if op == "+":
            result = left + right
        elif op == "-":
            result = left - right
        elif op == "*":
            result = left * right
        elif op == "/":
            result = left / right if right != 0 else None
        elif isinstance(left, int) and isinstance(right, int) and right != 0:  # %: Erlang's rem
            result = abs(left) % abs(right) * (-1 if left < 0 else 1)
        else:
            result = None
    except OverflowError:
        return None
    if isinstance(result, float) and not math.isfinite(result):
        return None
    return result


def _like(matches: Callable[[str], bool], subject: Any) -> bool | None:
    if isinstance(subject, bytes):
        try:
            subject = subject.decode()
        except UnicodeDecodeError:
            return None
    return matches(subject) if isinstance(subject, str) else None


def _truth(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _compile(node: Node) -> Evaluate:
    """A closure that evaluates ``node`` (so a message costs no tree walk by kind)."""
    kind = node[0]
    if kind == "lit":
        value = node[1]
        return lambda view: value
    if kind == "utc":
        return lambda view: time.time_ns() // 1_000_000
    if kind == "field":
        section, name = node[1], node[2]
        if section == "a":
            return lambda view: view.application.get(name)
        if section == "h":
            return lambda view: view.priority
        index = PROPERTY_FIELDS.index(name)
        return lambda view: view.properties[index]
    if kind == "not":
        inner = _compile(node[1])

        def negate(view: View) -> bool | None:
            value = _truth(inner(view))
            return None if value is None else not value
        return negate
    if kind in ("and", "or"):
        left, right = _compile(node[1]), _compile(node[2])
        stop = kind == "or"  # the value that decides at once: TRUE for OR, FALSE for AND

        def logic(view: View) -> bool | None:
            first = _truth(left(view))
            if first is stop:
                return stop
            second = _truth(right(view))
            if second is stop:
                return stop
            return None if first is None or second is None else not stop
        return logic
    if kind in ("cmp", "arith"):
        op, left, right = node[1], _compile(node[2]), _compile(node[3])
        apply = _compare if kind == "cmp" else _arithmetic
        return lambda view: apply(op, left(view), right(view))
    if kind in ("neg", "pos"):
        inner = _compile(node[1])
        sign = -1 if kind == "neg" else 1

        def signed(view: View) -> Any:
            value = inner(view)
            return sign * value if _number(value) else None
        return signed
    if kind == "in":
        subject, items = _compile(node[1]), [_compile(item) for item in node[2]]

        def member(view: View) -> bool | None:
            value = subject(view)
            if value is None:
                return None
            return any(_same(value, other) for other in (item(view) for item in items) if other is not None)
        return member
    if kind == "like":
        subject, matches = _compile(node[1]), node[2]
        return lambda view: _like(matches, subject(view))
    assert kind == "null"
    inner = _compile(node[1])
    return lambda view: inner(view) is None


class Expression(NamedTuple):
    text: str
    evaluate: Evaluate

    def matches(self, view: View) -> bool:
        """TRUE matches; FALSE and unknown do not."""
        return self.evaluate(view) is True

    def accepts(self, message: Message) -> bool:
        view = view_of(message)
        return view is not None and self.evaluate(view) is True


def compile_expression(text: str) -> Expression:
    return Expression(text, _compile(parse(text)))


def read(value: Value) -> Expression | None:
    """A filter-set entry's SQL filter (its described value: the descriptor, then the expression as a string);
    None if it is not one RabbitMQ 4.2 takes."""
    if value.kind != "described":
        return None
    descriptor, text = value.value
    if descriptor not in DESCRIPTOR or text.kind != "string":
        return None
    try:
        return compile_expression(text.value)
    except InvalidExpression:
        return None
