"""A compiled schema's nodes linked (``engine.json_schema_compiler`` makes them): references
resolved, each ``anyOf`` / ``oneOf`` made a table from a value's first byte to its alternative,
and each node's least nesting.

Where several alternatives start with the same byte (pydantic's ``Union`` of two models: both
objects) the byte leads to a ``par`` node, and the grammar follows each of them on the same bytes
until one is left or the value ends. A ``oneOf``'s alike alternatives must be told apart (no
answer written for one is an instance of another): objects with a required property whose
string constants differ (pydantic's discriminator), or each requiring a property the other lacks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_PARALLEL = 16  # states followed side by side in one value, those of alternatives inside it included
INFINITE = math.inf
_VALUE_START = frozenset(b'"{[-0123456789tfn')


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


class Linker:
    """What the compiler does once every node is made (its ``nodes``, ``pars`` and ``add``)."""

    nodes: list[tuple]
    pars: dict[tuple[int, ...], int]

    def add(self, node: tuple, parts: int = 1) -> int: ...

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
