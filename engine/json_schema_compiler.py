"""Structured outputs' schema compiler: a JSON Schema (the subset ``engine.json_schema`` lists) as
nodes its grammar walks, or a SchemaError saying what it cannot honour and where.

    nodes: ("any",) ("any_object",) ("string", StringRules | None) ("number", integer, NumberBounds | None)
           ("boolean",) ("null",) ("enum", texts) ("object", props) ("map", values, minProperties,
           maxProperties) ("array", items, minItems, maxItems, prefix items) ("union", {byte: node})
           ("par", nodes): alternatives that start with the same byte, followed side by side

An ``anyOf`` / ``oneOf`` is a table from a value's first byte to its alternative; where several
start alike (pydantic's ``Union`` of two models: both objects) the byte leads to a ``par`` node,
and the grammar follows each of them on the same bytes until one is left or the value ends. A
``oneOf``'s alike alternatives must be told apart: objects with a required property (pydantic's
discriminator) whose constants differ.

A ``$ref`` may recurse (a tree, a linked list): its definition's node is reserved before it is
compiled, and ``min_heights`` tells how deep each node's smallest instance nests, so the grammar
only opens a value that can still be closed under ``MAX_DEPTH`` levels (a schema with no finite
instance, or none that fits, is refused).
"""

from __future__ import annotations

import json
import math
import urllib.parse
from dataclasses import dataclass
from fractions import Fraction

from engine.json_formats import ANNOTATIONS, FORMATS, format_pattern
from engine.json_regex import PatternError, WorkBudget, compile_pattern
from engine.json_scalars import NumberBounds, StringRules

MAX_NODES = 2048  # parts of a schema: its nodes and its objects' properties (a larger one is refused)
MAX_ENUM = 512  # values of one enum
MAX_TEXT_BYTES = 65_536  # property names and enum values, in all
MAX_PATTERN_STATES = 4000  # automaton states of a schema's patterns and formats, in all
MAX_BOUND = 10**309  # a number bound's magnitude (past a double's range is refused)
MAX_PARALLEL = 16  # states followed side by side in one value, those of alternatives inside it included
MAX_SCHEMA_NESTING = 128  # schemas inside schemas (the compiler recurses; Python's stack is ~1,000 frames)

_VALUE_START = frozenset(b'"{[-0123456789tfn')
_REFUSED = ("multipleOf", "patternProperties", "propertyNames", "uniqueItems", "contains", "minContains",
            "maxContains", "not", "if", "then", "else", "dependentRequired", "dependentSchemas",
            "unevaluatedProperties", "unevaluatedItems", "contentEncoding", "contentMediaType",
            "$dynamicRef", "$recursiveRef", "dependencies")
# keywords that constrain a value (beside $ref or anyOf they would be dropped: refused instead)
_NUMBER_WORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_STRING_WORDS = ("minLength", "maxLength", "pattern", "format")
_OBJECT_WORDS = ("properties", "required", "additionalProperties", "minProperties", "maxProperties")
_ARRAY_WORDS = ("items", "prefixItems", "minItems", "maxItems")  # (additionalItems: only beside items as a list)
_CONSTRAINING = ("$ref", "allOf", "type", "enum", "const", "anyOf", "oneOf", *_OBJECT_WORDS, *_ARRAY_WORDS, *_NUMBER_WORDS,
                 *_STRING_WORDS)
INFINITE = math.inf
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


def _fits(value: object, kind: str) -> bool:
    """Whether an enum value is of a JSON Schema type (an enum beside a ``type`` keeps only those)."""
    if kind == "integer":  # (1.0 is an integer to JSON Schema)
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer())
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, {"string": str, "boolean": bool, "null": type(None), "object": dict,
                              "array": list}.get(kind, object))


def _count(value: object) -> object:
    """A count keyword's value, ``5.0`` read as 5 (JSON Schema from draft 6 takes it)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _bad_range(low: object, high: object) -> bool:
    """Whether counts are not integers with 0 <= low <= high (high None: no bound)."""
    bad = lambda n: not isinstance(n, int) or isinstance(n, bool)  # noqa: E731
    return bad(low) or low < 0 or (high is not None and (bad(high) or high < low))


class SchemaCompiler:
    def __init__(self, root: dict) -> None:
        self.root = root
        self.nodes: list[tuple] = []
        self.refs: dict[str, int] = {}
        self.open_refs: set[str] = set()
        self.text_bytes = 0  # property names' and enum values' bytes so far
        self.parts = 0
        self.pattern_work = WorkBudget()  # (shared by the schema's patterns)
        self.pattern_states = 0
        self.pars: dict[tuple[int, ...], int] = {}  # alike alternatives -> their "par" node

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
        if "allOf" in schema:  # (one schema in it: a $ref with a description, as pydantic v1 and others write it)
            parts = schema["allOf"]
            if not isinstance(parts, list) or not parts:
                raise SchemaError(f"{path}.allOf must be a non-empty array of schemas")
            kept = [(i, p) for i, p in enumerate(parts) if p is not True and p != {}]
            if len(kept) > 1 or len(beside) > 1:
                raise SchemaError(f"'allOf' with more than one schema, or beside other constraints, is not supported "
                                  f"(at {path})", unsupported=True)
            i, part = kept[0] if kept else (0, True)
            return self.compile(part, f"{path}.allOf[{i}]", level + 1)
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
                return self.union(nodes, f"{path}.{word}", word)
        kind = schema.get("type")
        if kind is None:  # an object's or an array's keywords without a type say which it is
            found = [kind for kind, words in (("object", _OBJECT_WORDS), ("array", _ARRAY_WORDS),
                                              ("number", _NUMBER_WORDS), ("string", _STRING_WORDS))
                     if any(w in schema for w in words)]
            if len(found) > 1:  # (each would constrain only its own type: written as one, the others are lost)
                raise SchemaError(f"{found[0]} and {found[1]} keywords without a 'type' are not supported "
                                  f"(at {path})", unsupported=True)
            kind = found[0] if found else None
        if kind is None:
            return self.add(("any",))
        if isinstance(kind, list):
            if not kind:
                raise SchemaError(f"{path}.type must not be empty")
            kinds = [k for k in dict.fromkeys(kind) if not (k == "integer" and "number" in kind)]  # (numbers hold them)
            return self.union([self.typed(schema, k, path, level) for k in kinds], f"{path}.type", "type")
        return self.typed(schema, kind, path, level)

    def typed(self, schema: dict, kind: object, path: str, level: int) -> int:
        if kind not in _TYPES:
            raise SchemaError(f"{path}.type: {str(kind)[:40]!r} is not a JSON Schema type")
        if kind in ("number", "integer"):
            return self.add(("number", kind == "integer", self.bounds(schema, kind == "integer", path)))
        if kind == "string":
            return self.add(("string", self.string_rules(schema, path)))
        if kind == "object":
            return self.object(schema, path, level)
        if kind == "array":
            return self.array(schema, path, level)
        return self.add((kind,))

    def bounds(self, schema: dict, integer: bool, path: str) -> NumberBounds | None:
        """``minimum``, ``maximum`` and their exclusive forms (a number, or draft 4's boolean beside
        ``minimum`` / ``maximum``), as exact fractions of the decimals written. A number's exclusive
        bound becomes an inclusive one at the nearest double inside it, so an answer read as a
        double (pydantic, Python's ``json``) still lies inside (found by QA: ``-0.500000000000000007``
        is below ``-0.5`` as a decimal, and is ``-0.5`` as a double); an inclusive bound already
        holds that way (rounding keeps order), and integers are read exactly."""
        ends: dict[str, tuple[Fraction, bool] | None] = {"lo": None, "hi": None}
        for word, side, excl in (("minimum", "lo", False), ("maximum", "hi", False),
                                 ("exclusiveMinimum", "lo", True), ("exclusiveMaximum", "hi", True)):
            value = schema.get(word)
            if value is None or isinstance(value, bool):
                continue
            if not isinstance(value, int | float) or (isinstance(value, float) and not math.isfinite(value)):
                raise SchemaError(f"{path}.{word} must be a finite number")
            if abs(value) > MAX_BOUND:  # (found by QA: a 4,000-digit bound's arithmetic held the engine's step)
                raise SchemaError(f"{path}.{word}: bounds beyond ±1e308 (a double's range) are not supported",
                                  unsupported=True)
            end = (Fraction(repr(value)) if isinstance(value, float) else Fraction(value),
                   excl or schema.get("exclusive" + word.capitalize()) is True)
            if end[1] and not integer:  # (an exclusive bound, as the double next inside it: below)
                inside = math.nextafter(float(value), math.inf if side == "lo" else -math.inf)
                end = (Fraction(inside), False)
            have = ends[side]  # (both given: the tighter one holds)
            if have is None or (end[0], end[1]) != have and (
                    (end[0] > have[0] or (end[0] == have[0] and end[1])) if side == "lo" else
                    (end[0] < have[0] or (end[0] == have[0] and end[1]))):
                ends[side] = end
        if ends["lo"] is None and ends["hi"] is None:
            return None
        bounds = NumberBounds.of(integer, ends["lo"], ends["hi"])
        if bounds is None:
            raise SchemaError(f"{path}: no {'integer' if integer else 'number'} lies between its bounds")
        return bounds

    def string_rules(self, schema: dict, path: str) -> StringRules | None:
        """``minLength`` / ``maxLength`` (in characters: code points) and ``pattern`` or ``format``."""
        low, high = _count(schema.get("minLength", 0)), _count(schema.get("maxLength"))
        if _bad_range(low, high):
            raise SchemaError(f"{path}: minLength and maxLength must be integers with 0 <= minLength <= maxLength")
        source, word = schema.get("pattern"), "pattern"
        if "format" in schema and schema["format"] not in ANNOTATIONS:
            if source is not None:
                raise SchemaError(f"'pattern' beside 'format' is not supported (at {path})", unsupported=True)
            name, word = schema["format"], "format"
            source = format_pattern(name) if isinstance(name, str) else None
            if source is None:
                raise SchemaError(f"format {str(name)[:40]!r} is not supported (at {path}; supported: "
                                  f"{', '.join(FORMATS)})", unsupported=True)
        if source is not None and not isinstance(source, str):
            raise SchemaError(f"{path}.pattern must be a string")
        try:
            automaton = None if source is None else compile_pattern(source, self.pattern_work)
            if low == 0 and high is None and automaton is None:
                return None
            if automaton is not None:  # (the engine's masks work per state: bounded per schema)
                self.pattern_states += automaton.size
                if self.pattern_states > MAX_PATTERN_STATES:
                    raise PatternError(f"the schema's patterns have more than {MAX_PATTERN_STATES} automaton "
                                       "states in all", unsupported=True)
            rules = StringRules.of(low, high, automaton, self.pattern_work)
        except PatternError as err:  # (also StringRules' own bound: found by QA, it was a 500)
            raise SchemaError(f"{path}.{word}: {err}", unsupported=err.unsupported) from err
        if rules is None:
            raise SchemaError(f"{path}: no string of {low} to {high} characters matches its {word}")
        return rules

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
        counted = "minProperties" in schema or "maxProperties" in schema
        if counted and _bad_range(_count(schema.get("minProperties", 0)), _count(schema.get("maxProperties"))):
            raise SchemaError(f"{path}: minProperties and maxProperties must be integers with 0 <= minProperties "
                              "<= maxProperties")
        if props and counted:
            raise SchemaError(f"'minProperties' or 'maxProperties' beside 'properties' is not supported (at {path})",
                              unsupported=True)
        if not props:
            if extra is False:
                if _count(schema.get("minProperties", 0)) != 0:
                    raise SchemaError(f"{path}: no object without properties has minProperties")
                return self.add(("object", ()))  # no property at all: {}
            if extra in (True, {}) and not counted:
                return self.add(("any_object",))
            return self.map(schema, extra, path, level)
        index = self.add(("object", ()), 1 + len(props))  # (its place first: a child's $ref may come back to it)
        compiled = tuple(Prop(self.count_text(json.dumps(name, ensure_ascii=False)[1:-1].encode()),
                              self.compile(sub, f"{path}.properties.{name}", level + 1), name in required)
                         for name, sub in props.items())
        self.nodes[index] = ("object", compiled)
        return index

    def map(self, schema: dict, values: object, path: str, level: int) -> int:
        """An object of any keys (``additionalProperties`` a schema, and no ``properties``: a
        ``dict[str, X]``), each value of ``values``; ``minProperties`` / ``maxProperties`` count
        its entries. A key written twice is one property to a reader, so ``maxProperties`` holds
        whatever the keys, and ``minProperties`` is taken up to 1 (more would need the keys told
        apart: refused)."""
        low, high = _count(schema.get("minProperties", 0)), _count(schema.get("maxProperties"))
        if low > 1:
            raise SchemaError(f"'minProperties' above 1 is not supported (at {path}: a key written twice would "
                              "count once)", unsupported=True)
        index = self.add(("map", None, low, high))  # (its place first: a value's $ref may come back to it)
        self.nodes[index] = ("map", self.compile(values, f"{path}.additionalProperties", level + 1), low, high)
        return index

    def array(self, schema: dict, path: str, level: int) -> int:
        """``items`` (or ``additionalItems`` after ``items`` as a list, draft 4 to 7) for the
        values after the ``prefixItems`` (a tuple), each of its own schema; false: none more."""
        low, high = _count(schema.get("minItems", 0)), _count(schema.get("maxItems"))
        if _bad_range(low, high):
            raise SchemaError(f"{path}: minItems and maxItems must be integers with 0 <= minItems <= maxItems")
        prefix, word = schema.get("prefixItems", []), "prefixItems"
        items, rest = schema.get("items", True), "items"
        if isinstance(items, list):  # (the tuple form of drafts 4 to 7)
            if "prefixItems" in schema:
                raise SchemaError(f"'items' as a list beside 'prefixItems' is not supported (at {path})",
                                  unsupported=True)
            prefix, word = items, "items"
            items, rest = schema.get("additionalItems", True), "additionalItems"
        if not isinstance(prefix, list):
            raise SchemaError(f"{path}.{word} must be an array of schemas")
        if items is False:  # no item past the prefix
            items, high = True, len(prefix) if high is None else min(high, len(prefix))
            if high < low:
                raise SchemaError(f"{path}: minItems {low} is more than its {len(prefix)} {word} allow")
        index = self.add(("array", None, low, high, ()))  # (its place first: an item's $ref may come back to it)
        firsts = tuple(self.compile(sub, f"{path}.{word}[{i}]", level + 1) for i, sub in enumerate(prefix))
        self.nodes[index] = ("array", self.compile(items, f"{path}.{rest}", level + 1), low, high,
                             firsts[:high] if high is not None else firsts)
        return index

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

    def union(self, alts: list[int], path: str, word: str) -> int:
        """Alternatives, told apart by their first byte; the table is made by ``link`` once every
        node is known (an alternative may be a definition still being compiled)."""
        return self.add(("alts", tuple(alts), path, word))

    def ref(self, ref: object, path: str, level: int) -> int:
        if ref == "#":
            ref = "#/"
        elif not isinstance(ref, str) or not ref.startswith(("#/$defs/", "#/definitions/")) or ref.count("/") != 2:
            raise SchemaError(f"{path}.$ref must be '#' or name a definition in #/$defs or #/definitions",
                              unsupported=True)
        if ref in self.refs:
            return self.refs[ref]  # (also while it is being compiled: a recursive definition)
        if ref == "#/":
            target = self.root
        else:
            section, name = ref[2:].split("/", 1)
            name = urllib.parse.unquote(name).replace("~1", "/").replace("~0", "~")  # (a JSON pointer's escapes)
            target = (self.root.get(section) or {}).get(name) if isinstance(self.root.get(section), dict) else None
        if target is None:
            raise SchemaError(f"{path}.$ref {ref[:60]!r} names no definition")
        index = self.refs[ref] = self.add(("ref", None), 0)
        compiled = self.compile(target, ref, level + 1)
        if compiled == index:
            raise SchemaError(f"{path}.$ref {ref[:60]!r} refers to itself and nothing else")
        self.nodes[index] = ("ref", compiled)
        return index

    def link(self, root: int) -> int:
        """Resolve references and make the alternatives' byte tables; the root's index after it."""
        def target(node: int) -> int:
            seen = set()
            while self.nodes[node][0] == "ref":
                if node in seen:
                    raise SchemaError("a $ref cycle with no schema in it")
                seen.add(node)
                node = self.nodes[node][1]
            return node

        alias = {i: target(i) for i, spec in enumerate(self.nodes) if spec[0] == "ref"}
        fix = lambda n: alias.get(n, n)  # noqa: E731
        for i, spec in enumerate(self.nodes):
            if spec[0] == "object":
                self.nodes[i] = ("object", tuple(Prop(p.key, fix(p.node), p.required) for p in spec[1]))
            elif spec[0] == "array":
                self.nodes[i] = ("array", fix(spec[1]), spec[2], spec[3], tuple(fix(n) for n in spec[4]))
            elif spec[0] == "map":
                self.nodes[i] = ("map", fix(spec[1]), *spec[2:])
            elif spec[0] == "alts":
                self.nodes[i] = ("alts", tuple(fix(a) for a in spec[1]), *spec[2:])
        for i, spec in enumerate(self.nodes):
            if spec[0] == "alts":
                self._table(i, set())
        return fix(root)

    def _table(self, node: int, open_: set[int]) -> frozenset[int]:
        """The first bytes of ``node``'s values; an ``alts`` node becomes a union (or the one
        alternative that takes anything) on the way."""
        spec = self.nodes[node]
        kind = spec[0]
        if kind == "alts":
            if node in open_:
                raise SchemaError(f"{spec[2]}: an alternative refers back to its own anyOf before any value "
                                  "is written", unsupported=True)
            open_.add(node)
            alts, path, word = spec[1], spec[2], spec[3]
            if any(self.nodes[a][0] == "any" for a in alts):
                if word == "oneOf" and len(alts) > 1:  # (a value matching the catch-all and another matches two)
                    raise SchemaError(f"'oneOf' with an alternative that takes anything is not supported "
                                      f"(at {path[:-6]})", unsupported=True)
                self.nodes[node] = ("any",)
                return _VALUE_START
            table: dict[int, list[int]] = {}
            for alt in alts:
                for b in self._table(alt, open_):
                    table.setdefault(b, []).append(alt)
            # (a union inside: its own table's alternative, so each byte leads to a plain node)
            leaves = {}
            for b, members in table.items():
                picks = [self._leaf(a, b) for a in members]
                found = tuple(dict.fromkeys(picks))
                if len(found) > MAX_PARALLEL:  # (before the pairs are compared: found by QA, 680 took 0.6 s)
                    raise SchemaError(f"{path} ({chr(b)!r}): more than {MAX_PARALLEL} alternatives start alike",
                                      unsupported=True)
                if len(picks) > 1 and word == "oneOf" and (  # (one schema twice: every value matches both)
                        len(found) < len(picks) or not self._told_apart(found)):
                    raise SchemaError(f"{path}: two alternatives can start with {chr(b)!r}; in a oneOf they must "
                                      "start differently (a string or null, an object or an array, ...) or be "
                                      "objects with a required property whose constants differ (a discriminator)",
                                      unsupported=True)
                leaves[b] = found[0] if len(found) == 1 else self._par(found, f"{path} ({chr(b)!r})")
            self.nodes[node] = ("union", leaves)
            open_.discard(node)
            return frozenset(table)
        if kind == "union":
            return frozenset(spec[1])
        if kind == "any":
            return _VALUE_START
        if kind == "enum":
            return frozenset(c[0] for c in spec[1])
        return {"any_object": frozenset(b"{"), "object": frozenset(b"{"), "map": frozenset(b"{"),
                "string": frozenset(b'"'),
                "number": frozenset(b"-0123456789"), "boolean": frozenset(b"tf"), "null": frozenset(b"n"),
                "array": frozenset(b"[")}[kind]

    def _leaf(self, node: int, b: int) -> int:
        spec = self.nodes[node]
        return self._leaf(spec[1][b], b) if spec[0] == "union" else node

    def _par(self, nodes: tuple[int, ...], where: str) -> int:
        """One node for alike alternatives (a ``par`` inside is flattened), made once per set."""
        flat = tuple(dict.fromkeys(m for n in nodes for m in (self.nodes[n][1] if self.nodes[n][0] == "par" else (n,))))
        if len(flat) > MAX_PARALLEL:  # (the grammar follows at most that many: the rest could never be written)
            raise SchemaError(f"{where}: more than {MAX_PARALLEL} alternatives start alike", unsupported=True)
        index = self.pars.get(flat)
        if index is None:
            index = self.pars[flat] = self.add(("par", flat), 0)
        return index

    def _told_apart(self, nodes: tuple[int, ...]) -> bool:
        """Whether no answer written for one of ``nodes`` is an instance of another: objects, each
        two of which share a required property whose values are string constants (an enum) none
        of which is in both (pydantic's discriminator), or each of which requires a property the
        other does not have (the other's answer lacks it: only listed properties are written)."""
        specs = [self.nodes[n] for n in nodes]
        if any(spec[0] != "object" for spec in specs):
            return False
        required = [{p.key: p.node for p in spec[1] if p.required} for spec in specs]
        names = [{p.key for p in spec[1]} for spec in specs]

        def tags(node: int) -> frozenset[bytes] | None:
            spec = self.nodes[node]
            texts = spec[1] if spec[0] == "enum" else ()
            return frozenset(texts) if texts and all(t.startswith(b'"') for t in texts) else None  # (not 1 and 1.0)

        def apart(i: int, j: int) -> bool:
            if set(required[i]) - names[j] and set(required[j]) - names[i]:
                return True
            for key in set(required[i]) & set(required[j]):
                a, b = tags(required[i][key]), tags(required[j][key])
                if a is not None and b is not None and not a & b:
                    return True
            return False

        return all(apart(i, j) for i in range(len(nodes)) for j in range(i + 1, len(nodes)))

    def min_heights(self) -> list[float]:
        """Per node, the fewest objects and arrays its smallest instance nests (INFINITE: it has no
        finite instance, e.g. a required property that recurses)."""
        heights = [INFINITE] * len(self.nodes)
        changed = True
        while changed:  # (a fixed point: recursion makes the nodes depend on one another)
            changed = False
            for i, spec in enumerate(self.nodes):
                kind = spec[0]
                if kind == "object":
                    h = 1 + max((heights[p.node] for p in spec[1] if p.required), default=0)
                elif kind == "array":  # (its required items: the prefix's first ones, then items)
                    _, items, low, _, prefix = spec
                    h = 1 + max((heights[n] for n in prefix[:low]), default=0)
                    if low > len(prefix):
                        h = max(h, 1 + heights[items])
                elif kind == "map":
                    h = 1 + (heights[spec[1]] if spec[2] > 0 else 0)
                elif kind == "union":
                    h = min(heights[a] for a in set(spec[1].values()))
                elif kind == "par":
                    h = min(heights[a] for a in spec[1])
                elif kind in ("any_object",):
                    h = 1
                elif kind in ("ref", "alts"):
                    continue
                else:
                    h = 0
                if h < heights[i]:
                    heights[i] = h
                    changed = True
        return heights
