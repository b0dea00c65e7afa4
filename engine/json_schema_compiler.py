"""Structured outputs' schema compiler: a JSON Schema (the subset ``engine.json_schema`` lists) as
nodes its grammar walks, or a SchemaError saying what it cannot honour and where.

    nodes: ("any",) ("any_object",) ("string",) ("number", integer) ("boolean",) ("null",)
           ("enum", texts) ("object", props) ("array", items, minItems, maxItems) ("union", {byte: node})
"""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass

MAX_NODES = 2048  # parts of a schema: its nodes and its objects' properties (a larger one is refused)
MAX_ENUM = 512  # values of one enum
MAX_TEXT_BYTES = 65_536  # property names and enum values, in all
MAX_SCHEMA_NESTING = 128  # schemas inside schemas (the compiler recurses; Python's stack is ~1,000 frames)

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


class SchemaCompiler:
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
