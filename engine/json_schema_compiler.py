"""Structured outputs' schema compiler: a JSON Schema (the subset ``engine.json_schema`` lists) as
nodes its grammar walks, or a SchemaError saying what it cannot honour and where.

    nodes: ("any",) ("any_object",) ("string", StringRules | None) ("number", integer, NumberBounds | None)
           ("boolean",) ("null",) ("enum", texts) ("object", props) ("map", values, minProperties,
           maxProperties) ("array", items, minItems, maxItems, prefix items) ("union", {byte: node})
           ("par", nodes): alternatives that start with the same byte, followed side by side

Once every node is made, ``engine.json_schema_link`` resolves the references, makes each
``anyOf`` / ``oneOf`` a table from a value's first byte to its alternatives and tells each node's
least nesting. A ``$ref`` may recurse (a tree, a linked list): its definition's node is reserved before it is
compiled, and ``min_heights`` tells how deep each node's smallest instance nests, so the grammar
only opens a value that can still be closed under ``MAX_DEPTH`` levels (a schema with no finite
instance, or none that fits, is refused).
"""

from __future__ import annotations

import json
import math
import urllib.parse
from fractions import Fraction

from engine.json_formats import ANNOTATIONS, FORMATS, format_pattern
from engine.json_regex import PatternError, WorkBudget, compile_pattern
from engine.json_scalars import NumberBounds, StringRules
from engine.json_schema_link import Linker, Prop, SchemaError

MAX_NODES = 2048  # parts of a schema: its nodes and its objects' properties (a larger one is refused)
MAX_ENUM = 512  # values of one enum
MAX_TEXT_BYTES = 65_536  # property names and enum values, in all
MAX_PATTERN_STATES = 4000  # automaton states of a schema's patterns and formats, in all
MAX_BOUND = 10**309  # a number bound's magnitude (past a double's range is refused)
MAX_STEP = 10**15  # an integer multipleOf's step (its checks loop over the step's digits)
MAX_SCHEMA_NESTING = 128  # schemas inside schemas (the compiler recurses; Python's stack is ~1,000 frames)

_REFUSED = ("patternProperties", "propertyNames", "uniqueItems", "contains", "minContains",
            "maxContains", "not", "if", "then", "else", "dependentRequired", "dependentSchemas",
            "unevaluatedProperties", "unevaluatedItems", "contentEncoding", "contentMediaType",
            "$dynamicRef", "$recursiveRef", "dependencies")
# keywords that constrain a value (beside $ref or anyOf they would be dropped: refused instead)
_NUMBER_WORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_STRING_WORDS = ("minLength", "maxLength", "pattern", "format")
_OBJECT_WORDS = ("properties", "required", "additionalProperties", "minProperties", "maxProperties")
_ARRAY_WORDS = ("items", "prefixItems", "minItems", "maxItems")  # (additionalItems: only beside items as a list)
_CONSTRAINING = ("$ref", "allOf", "type", "enum", "const", "anyOf", "oneOf", *_OBJECT_WORDS, *_ARRAY_WORDS, *_NUMBER_WORDS,
                 *_STRING_WORDS)
_TYPES = ("string", "number", "integer", "boolean", "null", "object", "array")


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


class SchemaCompiler(Linker):
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
        holds that way (rounding keeps order), and integers are read exactly. ``multipleOf`` on
        integers: an integer is a multiple of p/q (lowest terms) exactly when it is one of p."""
        step = self.step(schema, integer, path)
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
        if ends["lo"] is None and ends["hi"] is None and step is None:
            return None
        bounds = NumberBounds.of(integer, ends["lo"], ends["hi"], step)
        if bounds is None:
            raise SchemaError(f"{path}: no {'integer' if integer else 'number'} lies between its bounds"
                              + ("" if step is None else f" that is a multiple of {schema['multipleOf']}"))
        return bounds

    @staticmethod
    def step(schema: dict, integer: bool, path: str) -> int | None:
        if "multipleOf" not in schema:
            return None
        value = schema["multipleOf"]
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
            raise SchemaError(f"{path}.multipleOf must be a number > 0")
        if not integer:  # (a decimal's multiples as a double: 0.1 * 3 is not 0.3 there)
            raise SchemaError(f"'multipleOf' is only supported on integers (at {path})", unsupported=True)
        step = (Fraction(repr(value)) if isinstance(value, float) else Fraction(value)).numerator
        if step > MAX_STEP:  # (found by QA: a step of 1e300 made each digit's check ~80 ms)
            raise SchemaError(f"{path}.multipleOf: steps past 1e15 are not supported", unsupported=True)
        return None if step == 1 else step

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
