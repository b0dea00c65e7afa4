"""Structured outputs: decoding constrained to a JSON Schema (OpenAI's ``response_format`` of type
``json_schema``), on ``engine.json_grammar``'s recognizer and vocabulary masks.

    compile_schema(text) -> SchemaGrammar      raises SchemaError for what it cannot honour

What a schema may use, and what the answer then is:

    type            one type or a list of them ("string", "number", "integer", "boolean", "null",
                    "object", "array")
    properties      written in the schema's order; the ``required`` ones always, the others may be
                    left out; no other property is ever written (so ``additionalProperties`` holds
                    whatever its value); an object schema without properties takes any object
    items, minItems, maxItems
    enum, const     any JSON values, written compactly (``json.dumps`` with no spaces)
    anyOf, oneOf    alternatives that start differently (a string or null; an object or an
                    array ...): the first byte of the value picks one
    $ref            into ``$defs`` or ``definitions`` (not recursive)
    annotations     title, description, default, examples, ... are read past

The keywords that constrain values in other ways (``pattern``, ``format``, ``minimum``,
``minLength``, ``allOf``, ``not`` ...) are refused (SchemaError names the keyword and where it is),
never silently dropped. The root must be an object, as OpenAI requires.

States are ``json_grammar``'s (mode, stack, aux, ws); the stack also holds schema frames:
``("O", node, next property)`` for an object and ``("A", node, values begun)`` for an array, beside
the any-JSON frames ``"o"`` and ``"a"``.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import urllib.parse
from dataclasses import dataclass

from engine import json_grammar as g

MAX_NODES = 2048  # compiled schema nodes (a larger schema is refused)
MAX_ENUM = 512  # values of one enum
MAX_TEXT_BYTES = 65_536  # property names and enum values, in all
MAX_SCHEMA_NESTING = 128  # schemas inside schemas (the compiler recurses; Python's stack is ~1,000 frames)

ENUM, KEY_MATCH = "E", "M"  # aux: (node, bytes matched so far) / the key's bytes so far
_VALUE_START = frozenset(b'"{[-0123456789tfn')
_REFUSED = ("pattern", "format", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum",
            "exclusiveMaximum", "multipleOf", "patternProperties", "propertyNames", "minProperties",
            "maxProperties", "uniqueItems", "contains", "minContains", "maxContains", "prefixItems",
            "allOf", "not", "if", "then", "else", "dependentRequired", "dependentSchemas",
            "unevaluatedProperties", "unevaluatedItems", "contentEncoding", "contentMediaType",
            "$dynamicRef", "$recursiveRef", "dependencies")
# keywords that constrain a value (beside $ref or anyOf they would be dropped: refused instead)
_CONSTRAINING = ("$ref", "type", "properties", "required", "items", "minItems", "maxItems", "enum", "const",
                 "anyOf", "oneOf", "additionalProperties")
_TYPES = ("string", "number", "integer", "boolean", "null", "object", "array")


class SchemaError(ValueError):
    """A schema this engine cannot decode to (the message says what and where); ``unsupported``:
    valid JSON Schema that uses what is not honoured here (else the schema is wrong)."""

    def __init__(self, message: str, *, unsupported: bool = False) -> None:
        super().__init__(message)
        self.unsupported = unsupported


@dataclass(frozen=True, slots=True)
class Prop:
    key: bytes  # the name as JSON writes it inside its quotes
    node: int
    required: bool


class KeyIndex:
    """An object's property names for matching the key being written: every prefix of a name to
    the properties whose names start so (ascending), and from each next-property index the last
    property that may come next (the first required one) and whether the object may close there.
    Matching a key byte is then a lookup and a bisection, whatever the number of properties (found
    by QA: a loop over 11,000 optional properties per byte held the engine 30 s)."""

    def __init__(self, props: tuple[Prop, ...]) -> None:
        self.prefixes: dict[bytes, list[int]] = {}
        self.exact: dict[bytes, int] = {}
        for j, prop in enumerate(props):
            self.exact[prop.key] = j
            for end in range(len(prop.key) + 1):
                self.prefixes.setdefault(prop.key[:end], []).append(j)
        n = len(props)
        self.last = [n - 1] * (n + 1)
        self.closable = [True] * (n + 1)
        for j in range(n - 1, -1, -1):
            self.last[j] = j if props[j].required else self.last[j + 1]
            self.closable[j] = self.closable[j + 1] and not props[j].required

    def may_follow(self, prefix: bytes, index: int) -> bool:
        """Whether a property that may come next from ``index`` has a name starting with ``prefix``."""
        js = self.prefixes.get(prefix)
        if not js:
            return False
        at = bisect.bisect_left(js, index)
        return at < len(js) and js[at] <= self.last[index]


def _first_bytes(nodes: list[tuple], node: int) -> frozenset[int]:
    kind = nodes[node][0]
    if kind == "any":
        return _VALUE_START
    if kind == "enum":
        return frozenset(c[0] for c in nodes[node][1])
    if kind == "union":
        return frozenset(nodes[node][1])
    return {"any_object": frozenset(b"{"), "object": frozenset(b"{"), "string": frozenset(b'"'),
            "number": frozenset(b"-0123456789"), "boolean": frozenset(b"tf"), "null": frozenset(b"n"),
            "array": frozenset(b"[")}[kind]


def _fits(value: object, kind: str) -> bool:
    """Whether an enum value is of a JSON Schema type (an enum beside a ``type`` keeps only those)."""
    if kind == "integer":  # (1.0 is an integer to JSON Schema)
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer())
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, {"string": str, "boolean": bool, "null": type(None), "object": dict,
                              "array": list}.get(kind, object))


class _Compiler:
    def __init__(self, root: dict) -> None:
        self.root = root
        self.nodes: list[tuple] = []
        self.refs: dict[str, int] = {}
        self.open_refs: set[str] = set()
        self.text_bytes = 0  # property names' and enum values' bytes so far
        self.parts = 0

    def add(self, node: tuple, parts: int = 1) -> int:
        """A node, counted as ``parts`` (an object: one and its properties, which may share nodes)."""
        self.parts += parts
        if self.parts > MAX_NODES:
            raise SchemaError(f"the schema is too large (more than {MAX_NODES} parts: types, properties, "
                              "enums, alternatives)", unsupported=True)
        self.nodes.append(node)
        return len(self.nodes) - 1

    def count_text(self, data: bytes) -> bytes:
        self.text_bytes += len(data)
        if self.text_bytes > MAX_TEXT_BYTES:  # (each byte may be a step of a mask's walk)
            raise SchemaError(f"the schema's property names and enum values exceed {MAX_TEXT_BYTES} bytes",
                              unsupported=True)
        return data

    def compile(self, schema: object, path: str, level: int = 0) -> int:  # noqa: C901 - one case a keyword
        if level > MAX_SCHEMA_NESTING:
            raise SchemaError(f"the schema nests more than {MAX_SCHEMA_NESTING} levels (at {path[:120]})",
                              unsupported=True)
        if schema is True or schema == {}:
            return self.add(("any",))
        if not isinstance(schema, dict):
            raise SchemaError(f"{path} must be a schema (an object)" if schema is not False else
                              f"{path} is false (no value), which is not supported", unsupported=schema is False)
        for word in _REFUSED:
            if word in schema:
                raise SchemaError(f"'{word}' is not supported (at {path})", unsupported=True)
        beside = [w for w in _CONSTRAINING if w in schema]
        if "$ref" in schema:
            if len(beside) > 1:
                raise SchemaError(f"'$ref' beside other constraints is not supported (at {path})", unsupported=True)
            return self.ref(schema["$ref"], path, level)
        if "const" in schema or "enum" in schema:
            if set(beside) - {"type"} - {"const" if "const" in schema else "enum"}:
                raise SchemaError(f"'{'const' if 'const' in schema else 'enum'}' beside other constraints is not "
                                  f"supported (at {path})", unsupported=True)
            values = [schema["const"]] if "const" in schema else schema["enum"]
            return self.enum(values, schema.get("type"), path)
        for word in ("anyOf", "oneOf"):
            if word in schema:
                if len(beside) > 1:
                    raise SchemaError(f"'{word}' beside other constraints is not supported (at {path})",
                                      unsupported=True)
                alts = schema[word]
                if not isinstance(alts, list) or not alts:
                    raise SchemaError(f"{path}.{word} must be a non-empty array of schemas")
                nodes = [self.compile(a, f"{path}.{word}[{i}]", level + 1) for i, a in enumerate(alts)]
                if word == "oneOf" and len(nodes) > 1 and any(self.nodes[n][0] == "any" for n in nodes):
                    # (a value matching the catch-all and another would match two: oneOf refuses it)
                    raise SchemaError(f"'oneOf' with an alternative that takes anything is not supported (at {path})",
                                      unsupported=True)
                return self.union(nodes, f"{path}.{word}")
        kind = schema.get("type")
        if kind is None:  # an object's or an array's keywords without a type say which it is
            objects = [w for w in ("properties", "required", "additionalProperties") if w in schema]
            arrays = [w for w in ("items", "minItems", "maxItems") if w in schema]
            if objects and arrays:
                raise SchemaError(f"object and array keywords without a 'type' are not supported (at {path})",
                                  unsupported=True)
            kind = "object" if objects else "array" if arrays else None
        if kind is None:
            return self.add(("any",))
        if isinstance(kind, list):
            if not kind:
                raise SchemaError(f"{path}.type must not be empty")
            kinds = [k for k in dict.fromkeys(kind) if not (k == "integer" and "number" in kind)]  # (numbers hold them)
            return self.union([self.typed(schema, k, path, level) for k in kinds], f"{path}.type")
        return self.typed(schema, kind, path, level)

    def typed(self, schema: dict, kind: object, path: str, level: int) -> int:
        if kind not in _TYPES:
            raise SchemaError(f"{path}.type: {str(kind)[:40]!r} is not a JSON Schema type")
        if kind in ("number", "integer"):
            return self.add(("number", kind == "integer"))
        if kind == "object":
            return self.object(schema, path, level)
        if kind == "array":
            return self.array(schema, path, level)
        return self.add((kind,))

    def object(self, schema: dict, path: str, level: int) -> int:
        props = schema.get("properties") or {}
        required = schema.get("required") or []
        extra = schema.get("additionalProperties", True)
        if not isinstance(props, dict) or not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise SchemaError(f"{path}: properties must be an object and required an array of names")
        missing = [r for r in required if r not in props]
        if missing:
            raise SchemaError(f"{path}.required names {str(missing[0])[:40]!r}, which is not among its properties "
                              "(only listed properties are written)", unsupported=True)
        if not props:
            if extra is False:
                return self.add(("object", ()))  # no property at all: {}
            if extra not in (True, {}):
                raise SchemaError(f"'additionalProperties' with a schema and no properties (a map) is not supported "
                                  f"(at {path})", unsupported=True)
            return self.add(("any_object",))
        index = self.add(("object", ()), 1 + len(props))  # (its place first: a child's $ref may come back to it)
        compiled = tuple(Prop(self.count_text(json.dumps(name, ensure_ascii=False)[1:-1].encode()),
                              self.compile(sub, f"{path}.properties.{name}", level + 1), name in required)
                         for name, sub in props.items())
        self.nodes[index] = ("object", compiled)
        return index

    def array(self, schema: dict, path: str, level: int) -> int:
        low, high = schema.get("minItems", 0), schema.get("maxItems")
        items = schema.get("items", True)
        if items is False:  # no item at all: []
            items, high = True, 0
        if isinstance(items, list):
            raise SchemaError(f"'items' as a list (tuple form) is not supported (at {path})", unsupported=True)
        bad = lambda n: not isinstance(n, int) or isinstance(n, bool)  # noqa: E731
        if bad(low) or low < 0 or (high is not None and (bad(high) or high < low)):
            raise SchemaError(f"{path}: minItems and maxItems must be integers with 0 <= minItems <= maxItems")
        return self.add(("array", self.compile(items, f"{path}.items", level + 1), low, high))

    def enum(self, values: object, kind: object, path: str) -> int:
        if not isinstance(values, list) or not values:
            raise SchemaError(f"{path}.enum must be a non-empty array")
        if len(values) > MAX_ENUM:
            raise SchemaError(f"{path}.enum has more than {MAX_ENUM} values", unsupported=True)
        if kind is not None:  # beside a type, the values of that type
            kinds = kind if isinstance(kind, list) else [kind]
            values = [v for v in values if any(_fits(v, k) for k in kinds)]
            if not values:
                raise SchemaError(f"{path}: no value of its enum is of its type")
        try:
            texts = [json.dumps(v, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
                     for v in values]
        except (ValueError, RecursionError) as err:  # NaN and Infinity are no JSON (Python's parser reads them)
            raise SchemaError(f"{path}: an enum value is not JSON (NaN or Infinity)") from err
        return self.add(("enum", tuple(dict.fromkeys(self.count_text(t) for t in texts))))

    def union(self, alts: list[int], path: str) -> int:
        table: dict[int, int] = {}
        for alt in alts:
            if self.nodes[alt][0] == "any":
                return alt  # anything at all: the other alternatives add nothing
            for b in _first_bytes(self.nodes, alt):
                if b in table and table[b] != alt:
                    raise SchemaError(f"{path}: two alternatives can start with {chr(b)!r}; they must start "
                                      "differently (a string or null, an object or an array, ...)", unsupported=True)
                table[b] = alt
        return self.add(("union", table))

    def ref(self, ref: object, path: str, level: int) -> int:
        if not isinstance(ref, str) or not ref.startswith(("#/$defs/", "#/definitions/")) or ref.count("/") != 2:
            raise SchemaError(f"{path}.$ref must name a definition in #/$defs or #/definitions", unsupported=True)
        if ref in self.refs:
            return self.refs[ref]
        if ref in self.open_refs:
            raise SchemaError(f"{path}.$ref {ref[:60]!r} is recursive, which is not supported", unsupported=True)
        section, name = ref[2:].split("/", 1)
        name = urllib.parse.unquote(name).replace("~1", "/").replace("~0", "~")  # (a JSON pointer's escapes)
        target = (self.root.get(section) or {}).get(name) if isinstance(self.root.get(section), dict) else None
        if target is None:
            raise SchemaError(f"{path}.$ref {ref[:60]!r} names no definition")
        self.open_refs.add(ref)
        self.refs[ref] = self.compile(target, ref, level + 1)
        self.open_refs.discard(ref)
        return self.refs[ref]

    def nesting(self, root: int) -> int:
        """The most objects and arrays an instance can hold one inside another (a definition used
        in several places counts where it is deepest)."""
        memo: dict[int, int] = {}

        def height(node: int) -> int:
            if node not in memo:
                spec = self.nodes[node]
                kind = spec[0]
                if kind == "object":
                    memo[node] = 1 + max((height(p.node) for p in spec[1]), default=0)
                elif kind == "array":
                    memo[node] = 1 + height(spec[1])
                elif kind == "union":
                    memo[node] = max(height(alt) for alt in set(spec[1].values()))
                elif kind in ("any", "any_object"):
                    memo[node] = 1  # (any JSON: its own depth limit holds it)
                else:
                    memo[node] = 0
            return memo[node]

        return height(root)


class SchemaGrammar:
    """A compiled schema: ``json_grammar``'s grammar interface (``initial``, ``step``,
    ``is_complete``, ``plain_string``, ``name``) over its nodes."""

    is_complete = staticmethod(g.is_complete)
    plain_string = staticmethod(g.in_plain_string)

    def __init__(self, text: str) -> None:
        try:
            text.encode()
        except UnicodeEncodeError as err:  # (a lone surrogate: no byte of the answer could match it)
            raise SchemaError("the schema holds text that is not Unicode (a lone surrogate)") from err
        try:
            schema = json.loads(text)
        except RecursionError as err:
            raise SchemaError("the schema nests too deep to read", unsupported=True) from err
        except ValueError as err:
            raise SchemaError("the schema is not JSON") from err
        compiler = _Compiler(schema if isinstance(schema, dict) else {})
        root = compiler.compile(schema, "schema")
        self.nodes = compiler.nodes
        if compiler.nesting(root) > g.MAX_DEPTH:  # (past it the recognizer could only end the answer)
            raise SchemaError(f"the schema nests objects and arrays more than {g.MAX_DEPTH} deep", unsupported=True)
        if self.nodes[root][0] not in ("object", "any_object"):
            raise SchemaError("the schema's root must be an object (\"type\": \"object\")", unsupported=True)
        self.keys = {i: KeyIndex(spec[1]) for i, spec in enumerate(self.nodes) if spec[0] == "object"}
        self.name = "schema:" + hashlib.blake2b(text.encode(), digest_size=12).hexdigest()
        self.initial: g.State = (g.VALUE, (), root, 0)

    # ---- the recognizer ----------------------------------------------------------------------
    def step(self, state: g.State, b: int) -> g.State | None:  # noqa: C901, PLR0911, PLR0912 - one byte's cases
        mode, stack, aux, ws = state
        if mode == g.KEY_STR or mode == g.VAL_STR:
            return g.string_step(state, b)  # strings close into COLON (aux None: any value) or after the value
        if mode == g.NUMBER:
            part, integer = aux
            for chars, nxt in g.NUMBER_PARTS[part]:
                if b in chars:
                    return None if integer and nxt in ("dot", "e") else (g.NUMBER, stack, (nxt, integer), 0)
            return self.step(g.closed(stack), b) if part in g.NUMBER_ENDS else None
        if mode == g.LITERAL:
            if b != aux[0]:
                return None
            return (g.LITERAL, stack, aux[1:], 0) if len(aux) > 1 else g.closed(stack)
        if mode == ENUM:
            return self._enum(stack, aux[0], aux[1], b)
        if mode == KEY_MATCH:
            return self._match_key(stack, aux, b)
        if b in g.WHITESPACE:
            return (mode, stack, aux, ws + 1) if ws < g.MAX_WHITESPACE else None
        if mode == g.VALUE:
            return self._value(stack, aux, b)
        if mode == g.COLON:
            return (g.VALUE, stack, aux, 0) if b == 0x3A else None
        top = stack[-1] if stack else None
        if mode == g.ARR_FIRST:
            if top == "a":
                return g.closed(stack[:-1]) if b == 0x5D else self._value(stack, None, b)
            _, node, _ = top
            _, items, low, high = self.nodes[node]
            if b == 0x5D:
                return g.closed(stack[:-1]) if low == 0 else None
            return None if high == 0 else self._value(stack[:-1] + (("A", node, 1),), items, b)
        if mode == g.OBJ_FIRST or mode == g.OBJ_KEY:
            if b == 0x7D and mode == g.OBJ_FIRST:
                return g.closed(stack[:-1]) if top == "o" or self._may_close(top) else None
            if b != 0x22:
                return None
            if top == "o":
                return (g.KEY_STR, stack, (0, 0), 0)
            return (KEY_MATCH, stack, b"", 0) if self._property_left(top) else None
        if mode == g.AFTER:
            if top == "o" or top == "a":
                if b == 0x2C:
                    return (g.OBJ_KEY, stack, None, 0) if top == "o" else (g.VALUE, stack, None, 0)
                return g.closed(stack[:-1]) if b == (0x7D if top == "o" else 0x5D) else None
            kind, node, count = top
            if kind == "O":
                if b == 0x2C:
                    return (g.OBJ_KEY, stack, None, 0) if self._property_left(top) else None
                return g.closed(stack[:-1]) if b == 0x7D and self._may_close(top) else None
            _, items, low, high = self.nodes[node]
            if b == 0x2C:
                return (g.VALUE, stack[:-1] + (("A", node, count + 1),), items, 0) if high is None or count < high else None
            return g.closed(stack[:-1]) if b == 0x5D and count >= low else None
        return None  # DONE: only whitespace

    def _value(self, stack: tuple, node: int | None, b: int) -> g.State | None:
        """The state after ``b`` starts a value of ``node`` (None: any JSON value) inside ``stack``."""
        spec = ("any",) if node is None else self.nodes[node]
        kind = spec[0]
        if kind == "union":
            alt = spec[1].get(b)
            return None if alt is None else self._value(stack, alt, b)
        if kind == "enum":
            return self._enum(stack, node, b"", b)
        if b in (0x7B, 0x5B) and len(stack) >= g.MAX_DEPTH:
            return None
        if kind == "any":
            state = g.value_start(stack, b)
            if state is not None and state[0] == g.NUMBER:
                return (g.NUMBER, stack, (state[2], False), 0)
            return state
        if kind == "any_object":
            return (g.OBJ_FIRST, stack + ("o",), None, 0) if b == 0x7B else None
        if kind == "object":
            return (g.OBJ_FIRST, stack + (("O", node, 0),), None, 0) if b == 0x7B else None
        if kind == "array":
            return (g.ARR_FIRST, stack + (("A", node, 0),), None, 0) if b == 0x5B else None
        if kind == "string":
            return (g.VAL_STR, stack, (0, 0), 0) if b == 0x22 else None
        if kind == "number":
            start = g.value_start(stack, b) if b == 0x2D or b in g.DIGITS else None
            return None if start is None else (g.NUMBER, stack, (start[2], spec[1]), 0)
        if kind == "boolean":
            return (g.LITERAL, stack, g.LITERALS[b], 0) if b in (0x74, 0x66) else None
        return (g.LITERAL, stack, b"ull", 0) if b == 0x6E else None  # null

    def _enum(self, stack: tuple, node: int, matched: bytes, b: int) -> g.State | None:
        texts = self.nodes[node][1]
        seen = matched + bytes((b,))
        if any(t.startswith(seen) for t in texts):
            if seen in texts and not any(len(t) > len(seen) and t.startswith(seen) for t in texts):
                return g.closed(stack)  # nothing longer can follow: the value is whole
            return (ENUM, stack, (node, seen), 0)
        if matched in texts:  # a whole value (a number another value extends) ended before this byte
            return self.step(g.closed(stack), b)
        return None

    def _property_left(self, frame: tuple) -> bool:
        """Whether a property may come next (one is left)."""
        return frame[2] < len(self.nodes[frame[1]][1])

    def cache_frame(self, frame: object, reach: int) -> object:
        """``frame`` as a mask's cache key holds it: an array's items begun, as how many more it
        needs and may take, each up to ``reach`` (what one token could add: more does not change
        which tokens pass), so a long array's items share their masks (found by review)."""
        if not isinstance(frame, tuple) or frame[0] != "A":
            return frame
        _, node, count = frame
        _, _, low, high = self.nodes[node]
        return ("A", node, min(max(low - count, 0), reach), None if high is None else min(high - count, reach))

    def _may_close(self, frame: tuple) -> bool:
        return self.keys[frame[1]].closable[frame[2]]

    def _match_key(self, stack: tuple, matched: bytes, b: int) -> g.State | None:
        """The key being written, ``matched`` so far, and byte ``b``: it must stay the start of a
        property that may come next (from the next one up to the first required one)."""
        _, node, index = stack[-1]
        keys = self.keys[node]
        seen = matched + bytes((b,))
        if keys.may_follow(seen, index):  # (a quote inside a key is escaped: this goes first)
            return (KEY_MATCH, stack, seen, 0)
        if b == 0x22:
            j = keys.exact.get(matched)
            if j is not None and index <= j <= keys.last[index]:
                return (g.COLON, stack[:-1] + (("O", node, j + 1),), self.nodes[node][1][j].node, 0)
        return None


@functools.lru_cache(maxsize=64)
def compile_schema(text: str) -> SchemaGrammar:
    """The grammar of the schema in ``text`` (JSON), compiled once per text."""
    return SchemaGrammar(text)
