"""Ordered relations in a question, for the verifier's ``relation`` guard.

Word sets lose order, but some questions are told apart only by it: "convert Celsius to
Fahrenheit" and "convert Fahrenheit to Celsius" share every word. A relation is the ordered
pair of word sets on either side of a word that gives the pair a direction:

    kind         marker                                  src (left)          dst (right)
    to           to / into / onto / toward(s)            what is converted   what it becomes
                 from A to B, to B from A                 A                   B
    from         B from A (no "to" in the clause)         A                   B
    than         than                                    the compared (every what it is compared with
                                                         salient word of the
                                                         clause before it)
    north of     <position word> of (north, left, top …) the placed thing    the reference
    before       before / after / above / below / behind  the placed thing    the reference
    verb:<v>     a word between two names (v: its stem)  the subject         the object ("by" after
                                                                             v: passive, flipped)
    to           unit in a unit: "ounces in a pound"      the pound           the ounces
                 unit in units: "a pound in ounces"       the pound           the ounces

Each side is the nearest non-empty stretch of salient words (content words, names, units,
numbers) next to the marker, inside one clause (split at . ? ! ; : , "or", "but"). A "to" with
nothing salient before it is an infinitive ("how to convert …", "the best way to …") and is not a
relation. Two texts are reversed when relations of the same kind cross: a word on the src side in
one is on the dst side in the other, and another word moves the opposite way. Only that
counts: a paraphrase may reorder its words freely ("France's capital city is?"), move a
clause ("In Python, …") or swap the halves of "from A to B" / "to B from A".

"in" between two units is a conversion, read as a "to": "how many ounces in a pound" converts a
pound to ounces, as does "a pound in ounces" (a bare plural after "in" is the target unit, an
article or "each/every/per" before it marks the unit counted in). Only the two units are its sides.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from cache import lexicon as lx


class Word(NamedTuple):
    low: str  # the token, lower-cased ("to", "north", "," …)
    key: str | None  # what it means for comparison (stem, unit, number); None: a function word
    entity: bool  # a name or a member of a known entity class
    unit: bool = False  # a unit of measure ("ounces", "km", "celsius")


@dataclass(slots=True, frozen=True)
class Relation:
    kind: str
    src: frozenset[str]
    dst: frozenset[str]


def relations(words: Sequence[Word]) -> frozenset[Relation]:
    """Every relation of a text, given its words in order (punctuation included)."""
    found: set[Relation] = set()
    for clause in _clauses(words):
        found.update(_marked(clause))
        found.update(_subject_object(clause))
        found.update(_unit_in(clause))
    return frozenset(found)


def reversed_relation(a: frozenset[Relation], b: frozenset[Relation]) -> bool:
    """True when a relation of ``a`` and one of ``b`` of the same kind cross (see the module doc)."""
    for ra in a:
        for rb in b:
            if ra.kind == rb.kind and _crosses(ra, rb):
                return True
    return False


def _crosses(ra: Relation, rb: Relation) -> bool:
    forth = (ra.src - ra.dst) & (rb.dst - rb.src)
    back = (ra.dst - ra.src) & (rb.src - rb.dst)
    return bool(forth and back)


def _clauses(words: Sequence[Word]) -> Iterator[list[Word]]:
    clause: list[Word] = []
    for w in words:
        if w.low in lx.CLAUSE_BREAKS:
            yield clause
            clause = []
        else:
            clause.append(w)
    yield clause


def _marker(clause: list[Word], i: int) -> tuple[str, int] | None:
    """(kind, width in words) of a marker starting at ``clause[i]``, or None."""
    low = clause[i].low
    if low in lx.DIRECTION_TO:
        return "to", 1
    if low in ("from", "than") or low in lx.ORDER_PREPOSITIONS:
        return low, 1
    if low in lx.POSITIONS and i + 1 < len(clause) and clause[i + 1].low == "of":
        return low + " of", 2
    return None


def _marked(clause: list[Word]) -> Iterator[Relation]:
    marks: list[str] = []
    segments: list[frozenset[str]] = []  # segments[k]: salient words just before marks[k]; one more at the end
    current: set[str] = set()
    i = 0
    while i < len(clause):
        m = _marker(clause, i)
        if m is None:
            if clause[i].key:
                current.add(clause[i].key)
            i += 1
            continue
        marks.append(m[0])
        segments.append(frozenset(current))
        current = set()
        i += m[1]
    segments.append(frozenset(current))

    def left(k: int) -> frozenset[str]:
        return next((s for s in reversed(segments[:k + 1]) if s), frozenset())

    def right(k: int) -> frozenset[str]:
        return next((s for s in segments[k + 1:] if s), frozenset())

    tos = [k for k, kind in enumerate(marks) if kind == "to"]
    for k, kind in enumerate(marks):
        src, dst = left(k), right(k)
        if kind == "than":  # the compared is the clause so far: "Mercury closer to the sun than Venus"
            src = frozenset().union(*segments[:k + 1])
        if kind == "from":
            src = dst
            if tos:  # "from A to B": the to's far side is the destination
                after = [t for t in tos if t > k]
                kind, dst = "to", right(after[0] if after else tos[-1])
            else:  # "B from A" is its own kind: "stop my dog from barking" is no "to"
                dst = left(k)
        if src and dst:
            yield Relation(kind, src, dst)


def _subject_object(clause: list[Word]) -> Iterator[Relation]:
    """"the moon orbits the earth": consecutive names with a relating word between them."""
    names = [i for i, w in enumerate(clause) if w.entity and w.key]
    for i, j in zip(names, names[1:], strict=False):
        x, y = clause[i].key, clause[j].key
        between = clause[i + 1:j]
        if x == y or any(w.low in lx.SYMMETRIC or _marker(clause, i + 1 + n) for n, w in enumerate(between)):
            continue
        for n, w in enumerate(between):
            if w.key and not w.entity:
                passive = n + 1 < len(between) and between[n + 1].low == "by"
                yield Relation("verb:" + w.key, frozenset({y if passive else x}), frozenset({x if passive else y}))


_ONE = frozenset("a an each every per the".split())


def _key(w: Word) -> str | None:
    """A word's key, or for an everyday unit word that has none (a stopword: "a bit") its unit: "bits
    in a byte" / "bytes in a bit" (found by QA: read as no relation, served each other's answer)."""
    return w.key or (lx.UNIT_OF.get(w.low) if w.unit else None)


def _unit_in(clause: list[Word]) -> Iterator[Relation]:
    """"ounces in a pound" (a pound to ounces) and "a pound in ounces" (the same): see the module doc."""
    for i, w in enumerate(clause):
        if w.low != "in":
            continue
        before = next((x for x in reversed(clause[:i]) if _key(x)), None)
        j = next((k for k in range(i + 1, len(clause)) if _key(clause[k])), None)
        if before is None or j is None or not (before.unit and clause[j].unit) or _key(before) == _key(clause[j]):
            continue
        left, right = frozenset({_key(before)}), frozenset({_key(clause[j])})
        counted = any(x.low in _ONE for x in clause[i + 1:j])  # "in a pound": one pound holds how many?
        yield Relation("to", right, left) if counted else Relation("to", left, right)
