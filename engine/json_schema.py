"""Structured outputs: decoding constrained to a JSON Schema (OpenAI's ``response_format`` of type
``json_schema``), on ``engine.json_grammar``'s recognizer and vocabulary masks.

    compile_schema(text) -> SchemaGrammar      raises SchemaError for what it cannot honour

What a schema may use, and what the answer then is:

    type            one type or a list of them ("string", "number", "integer", "boolean", "null",
                    "object", "array")
    properties      written in the schema's order; the ``required`` ones always, the others may be
                    left out; no other property is ever written (so ``additionalProperties`` holds
                    whatever its value); an object schema without properties takes any object
    maps            additionalProperties a schema and no properties: any keys, each value of it;
                    maxProperties, and minProperties up to 1 (a key written twice counts once)
    items, minItems, maxItems, prefixItems (a tuple; items as a list with additionalItems too)
    enum, const     any JSON values, written compactly (``json.dumps`` with no spaces)
    anyOf, oneOf    the value's first byte picks the alternatives that start so; several are
                    followed side by side (mode ``PARALLEL``, at most ``MAX_PARALLEL`` states);
                    a oneOf's must be told apart (a discriminator)
    $ref            "#" or into ``$defs`` / ``definitions``, recursion included (a value is begun
                    only where its smallest instance fits under ``MAX_DEPTH``)
    allOf           of one schema (beside annotations): that schema
    minimum, maximum, exclusiveMinimum, exclusiveMaximum    on numbers (written without exponent)
    multipleOf      on integers
    minLength, maxLength, pattern, format                   on strings (``engine.json_scalars``)
    annotations     title, description, default, examples, ... are read past

The keywords that constrain values in other ways (``uniqueItems``, ``allOf`` of several, ``not`` ...) are
refused (SchemaError names the keyword and where it is), never silently dropped. The root must be
an object, as OpenAI requires.

States are ``json_grammar``'s (mode, stack, aux, ws); the stack also holds schema frames:
``("O", node, next property)`` for an object, ``("D", node, entries begun)`` for a map and
``("A", node, values begun)`` for an array, beside
the any-JSON frames ``"o"`` and ``"a"``; strings with rules and bounded numbers have modes of
their own (``STRING``, ``BOUNDED``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from engine import json_grammar as g
from engine import json_scalars as sc
from engine import json_strings as js
from engine.json_schema_compiler import SchemaCompiler
from engine.json_schema_keys import KeyIndex
from engine.json_schema_link import INFINITE, MAX_PARALLEL, SchemaError

ENUM, KEY_MATCH = "E", "M"  # aux: (node, bytes matched so far) / the key's bytes so far
STRING, BOUNDED = "C", "B"  # aux: (node, decoder, characters, automaton state) / (part, node, text so far)
PARALLEL = "P"  # aux: (depth, states, count): alike alternatives of one value, each a whole state, side by side


class SchemaGrammar:
    """A compiled schema: ``json_grammar``'s ``Grammar`` interface over its nodes."""

    is_complete = staticmethod(g.is_complete)

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
        compiler = SchemaCompiler(schema if isinstance(schema, dict) else {})
        root = compiler.link(compiler.compile(schema, "schema"))
        self.nodes = compiler.nodes
        heights = compiler.min_heights()
        if heights[root] == INFINITE:
            raise SchemaError("the schema has no finite instance (a required property or item that recurses "
                              "into itself with no way out)")
        if heights[root] > g.MAX_DEPTH:  # (past it the recognizer could only end the answer)
            raise SchemaError(f"the schema nests objects and arrays more than {g.MAX_DEPTH} deep", unsupported=True)
        self.heights = [int(h) if h != INFINITE else g.MAX_DEPTH + 1 for h in heights]
        # objects and arrays a value needs below it, at most (what a mask's key must tell apart)
        self.depth_reach = max((h for h in self.heights if h <= g.MAX_DEPTH), default=0)
        self.deepest = {i: max((self.heights[p.node] for p in spec[1]), default=0)
                        for i, spec in enumerate(self.nodes) if spec[0] == "object"}
        if self.nodes[root][0] not in ("object", "any_object", "map"):
            raise SchemaError("the schema's root must be an object (\"type\": \"object\")", unsupported=True)
        self._keys: dict[int, KeyIndex] = {}  # built as decoding reaches each object (a front only checks)
        self.name = "schema:" + hashlib.blake2b(text.encode(), digest_size=12).hexdigest()
        self.initial: g.State = (g.VALUE, (), root, 0)

    # ---- the recognizer ----------------------------------------------------------------------
    def step(self, state: g.State, b: int) -> g.State | None:  # noqa: C901, PLR0911, PLR0912 - one byte's cases
        mode, stack, aux, ws = state
        if mode == PARALLEL:
            return self._parallel(stack, aux[1], b)
        if mode == g.KEY_STR or mode == g.VAL_STR:
            nxt = g.string_step(state, b)  # strings close into COLON (aux None: any value) or after the value
            if nxt is not None and nxt[0] == g.COLON and stack[-1][0] == "D":
                return (g.COLON, stack, self.nodes[stack[-1][1]][1], 0)  # a map's key: its values' node next
            return nxt
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
        if mode == STRING:
            return self._string(stack, aux, b)
        if mode == BOUNDED:
            return self._bounded(stack, aux, b)
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
            _, items, low, high, prefix = self.nodes[node]
            if b == 0x5D:
                return g.closed(stack[:-1]) if low == 0 else None
            return None if high == 0 else self._value(stack[:-1] + (("A", node, 1),), prefix[0] if prefix else items, b)
        if mode == g.OBJ_FIRST or mode == g.OBJ_KEY:
            if b == 0x7D and mode == g.OBJ_FIRST:
                may = top == "o" or (self.nodes[top[1]][2] == 0 if top[0] == "D" else self._may_close(top))
                return g.closed(stack[:-1]) if may else None
            if b != 0x22:
                return None
            if top == "o":
                return (g.KEY_STR, stack, (0, 0), 0)
            if top[0] == "D":
                if mode == g.OBJ_KEY:  # (after a comma, which began the entry)
                    return (g.KEY_STR, stack, (0, 0), 0)
                _, values, _, high = self.nodes[top[1]]
                fits = high != 0 and len(stack) + self.heights[values] <= g.MAX_DEPTH
                return (g.KEY_STR, stack[:-1] + (("D", top[1], 1),), (0, 0), 0) if fits else None
            return (KEY_MATCH, stack, b"", 0) if self._property_left(top, len(stack)) else None
        if mode == g.AFTER:
            if top == "o" or top == "a":
                if b == 0x2C:
                    return (g.OBJ_KEY, stack, None, 0) if top == "o" else (g.VALUE, stack, None, 0)
                return g.closed(stack[:-1]) if b == (0x7D if top == "o" else 0x5D) else None
            kind, node, count = top
            if kind == "O":
                if b == 0x2C:
                    return (g.OBJ_KEY, stack, None, 0) if self._property_left(top, len(stack)) else None
                return g.closed(stack[:-1]) if b == 0x7D and self._may_close(top) else None
            if kind == "D":  # (an entry fits where the first did: the same values' node, the same depth)
                _, _, low, high = self.nodes[node]
                if b == 0x2C:
                    return (g.OBJ_KEY, stack[:-1] + (("D", node, count + 1),), None, 0) if (
                        high is None or count < high) else None
                return g.closed(stack[:-1]) if b == 0x7D and count >= low else None
            _, items, low, high, prefix = self.nodes[node]
            if b == 0x2C:
                nxt = prefix[count] if count < len(prefix) else items
                if (high is not None and count >= high) or (  # (a prefix item may need more levels than the last)
                        count >= low and len(stack) + self.heights[nxt] > g.MAX_DEPTH):
                    return None
                return (g.VALUE, stack[:-1] + (("A", node, count + 1),), nxt, 0)
            return g.closed(stack[:-1]) if b == 0x5D and count >= low else None
        return None  # DONE: only whitespace

    def _value(self, stack: tuple, node: int | None, b: int) -> g.State | None:
        """The state after ``b`` starts a value of ``node`` (None: any JSON value) inside ``stack``."""
        spec = ("any",) if node is None else self.nodes[node]
        kind = spec[0]
        if kind == "union":
            alt = spec[1].get(b)
            return None if alt is None else self._value(stack, alt, b)
        if kind == "par":
            states: list = []
            for alt in spec[1]:
                state = self._value(stack, alt, b)
                if state is not None:
                    states.extend(state[2][1] if state[0] == PARALLEL else (state,))
            return self._together(stack, states)
        if kind == "enum":
            return self._enum(stack, node, b"", b)
        if b in (0x7B, 0x5B) and (len(stack) >= g.MAX_DEPTH or (
                node is not None and len(stack) + self.heights[node] > g.MAX_DEPTH)):
            return None  # (no room left for the least it must hold)
        if kind == "any":
            state = g.value_start(stack, b)
            if state is not None and state[0] == g.NUMBER:
                return (g.NUMBER, stack, (state[2], False), 0)
            return state
        if kind == "any_object":
            return (g.OBJ_FIRST, stack + ("o",), None, 0) if b == 0x7B else None
        if kind == "object":
            return (g.OBJ_FIRST, stack + (("O", node, 0),), None, 0) if b == 0x7B else None
        if kind == "map":
            return (g.OBJ_FIRST, stack + (("D", node, 0),), None, 0) if b == 0x7B else None
        if kind == "array":
            return (g.ARR_FIRST, stack + (("A", node, 0),), None, 0) if b == 0x5B else None
        if kind == "string":
            if b != 0x22:
                return None
            rules = spec[1]
            if rules is None:
                return (g.VAL_STR, stack, (0, 0), 0)
            return (STRING, stack, (node, 0, 0, 0 if rules.automaton is None else rules.automaton.initial), 0)
        if kind == "number":
            start = g.value_start(stack, b) if b == 0x2D or b in g.DIGITS else None
            if start is None:
                return None
            if spec[2] is None:
                return (g.NUMBER, stack, (start[2], spec[1]), 0)
            text = bytes((b,))
            return (BOUNDED, stack, (start[2], node, text), 0) if spec[2].viable(text) else None
        if kind == "boolean":
            return (g.LITERAL, stack, g.LITERALS[b], 0) if b in (0x74, 0x66) else None
        return (g.LITERAL, stack, b"ull", 0) if b == 0x6E else None  # null

    def _parallel(self, stack: tuple, states: tuple, b: int) -> g.State | None:
        """Alike alternatives each take ``b``, those that cannot drop out. Those that finish the
        value reach the same state, ``stack``'s own after the value (each stepped it with the same
        bytes): an object, array or string ends at the same byte in each, and a number, which one
        may end early (an enum's ``1`` beside an integer's ``12``), at the next byte that is not
        part of it, the only kind the finished one takes. So they merge there, and a single one
        left is the state. (A ``oneOf``'s are told apart: only one can finish.)"""
        return self._together(stack, [nxt for nxt in (self.step(state, b) for state in states) if nxt is not None])

    @staticmethod
    def _together(stack: tuple, states: list) -> g.State | None:
        """One state for ``states``: the one left, or all side by side, at most ``MAX_PARALLEL``
        in all (counting those inside each), the schema's first ones kept. Unions whose
        alternatives stay undecided inside one another (a recursive union told apart by its
        last property) would otherwise double at each level; past the bound the later
        alternatives are not followed: the answer still follows the schema (each state kept is
        one of its alternatives, and each can always go on), it only may not take those."""
        unique = tuple(dict.fromkeys(states))
        if len(unique) <= 1:
            return unique[0] if unique else None
        kept, count = [], 0
        for state in unique:
            weight = state[2][2] if state[0] == PARALLEL else 1
            if kept and count + weight > MAX_PARALLEL:
                break
            kept.append(state)
            count += weight
        if len(kept) == 1:
            return kept[0]
        return (PARALLEL, stack, (len(stack), tuple(kept), count), 0)

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

    def _string(self, stack: tuple, aux: tuple, b: int) -> g.State | None:
        """A string with rules (length, pattern): its characters decoded, each checked, and each
        partial one (a UTF-8 lead, an escape's digits) only when some character it can become is."""
        node, dec, count, state = aux
        rules: sc.StringRules = self.nodes[node][1]
        got = js.string_byte(dec, b)
        if got is None:
            return None
        dec, char = got
        if char is None:
            ok = rules.some_char(state, count, js.pending_chars(dec))
            return (STRING, stack, (node, dec, count, state), 0) if ok else None
        if char == js.CLOSE:
            return g.closed(stack) if rules.may_close(state, count) else None
        state = rules.next_char(state, count, char)
        return None if state is None else (STRING, stack, (node, 0, count + 1, state), 0)

    def _bounded(self, stack: tuple, aux: tuple, b: int) -> g.State | None:
        """A number with bounds: written without an exponent, each prefix one some number in range starts."""
        part, node, text = aux
        bounds: sc.NumberBounds = self.nodes[node][2]
        for chars, nxt in g.NUMBER_PARTS[part]:
            if b in chars:
                if nxt == "e" or (nxt == "dot" and bounds.integer):
                    return None
                text += bytes((b,))
                return (BOUNDED, stack, (nxt, node, text), 0) if bounds.viable(text) else None
        if part in g.NUMBER_ENDS and bounds.contains(text):
            return self.step(g.closed(stack), b)
        return None

    def _property_left(self, frame: tuple, depth: int) -> bool:
        """Whether a property may come next (one is left whose value fits ``depth`` levels down)."""
        _, node, index = frame
        props = self.nodes[node][1]
        if index >= len(props):
            return False
        keys = self._key_index(node)
        last = keys.last[index]
        if props[last].required or depth + self.deepest[node] <= g.MAX_DEPTH:
            return True  # (a required property always fits: its object did)
        return any(depth + self.heights[props[j].node] <= g.MAX_DEPTH for j in range(index, last + 1))

    def plain_room(self, state: g.State) -> int | Callable | None:
        """Inside a string, how many characters of plain text may come next whatever they are, or
        (a pattern's broad state) what tells which plain tokens may (``StringRules.plain_mask``);
        None: outside one, inside a character, or a narrow pattern state (the trie walk is cheaper)."""
        mode, _, aux, _ = state
        if mode == PARALLEL:  # (see string_members: the masks take the plain tokens from each)
            return None
        if mode == STRING:
            node, dec, count, at = aux
            if dec != 0:
                return None
            rules = self.nodes[node][1]
            room = rules.plain_room(at, count)
            if room is not None:
                return room
            return functools.partial(rules.plain_mask, at, count) if rules.broad(at) else None
        return g.plain_room(state)

    def string_members(self, state: g.State) -> tuple | None:
        """Alike alternatives side by side that are each inside a string (a key being matched, a
        string enum's value): plain text keeps each inside its string and adds no alternative, so
        a plain token may come next exactly where one of them takes it, and their own masks (kept
        per member: the same member recurs in many combinations) say which (``JsonVocabulary``);
        None for any other state (its tokens are walked)."""
        if state[0] != PARALLEL:
            return None
        members = state[2][1]
        return members if all(self._in_string(s) for s in members) else None

    def _in_string(self, state: g.State) -> bool:
        mode = state[0]
        if mode in (g.KEY_STR, g.VAL_STR, STRING, KEY_MATCH):
            return True
        if mode == ENUM:
            return state[2][1][:1] == b'"'
        return mode == PARALLEL and all(self._in_string(s) for s in state[2][1])

    def cache_aux(self, mode: str, aux: object, reach: int, levels: int) -> object:
        """``aux`` as a mask's key holds it: a string's character count as far as a token of at
        most ``reach`` characters can tell it apart (``StringRules.cache_count``); alternatives
        side by side as each one's frames inside the value, aux, and levels still free up to
        ``levels`` (its frames outside are the state's own, cut as the key cuts a stack)."""
        if mode == PARALLEL:
            depth, states, _ = aux
            return tuple((m, min(g.MAX_DEPTH - len(st), levels), tuple(self.cache_frame(f, reach) for f in st[depth:]),
                          self.cache_aux(m, a, reach, levels), ws) for m, st, a, ws in states)
        if mode != STRING:
            return aux
        node, dec, count, at = aux
        rules = self.nodes[node][1]
        return (node, dec, rules.cache_count(at, count, reach),
                at if rules.automaton is None else rules.state_class(at, reach))

    def cache_frame(self, frame: object, reach: int) -> object:
        """``frame`` as a mask's cache key holds it: an array's items begun, as how many more it
        needs and may take, each up to ``reach`` (what one token could add: more does not change
        which tokens pass), so a long array's items share their masks (found by review)."""
        if not isinstance(frame, tuple) or frame[0] == "O":
            return frame
        kind, node, count = frame
        spec = self.nodes[node]
        if kind == "A" and count < len(spec[4]):  # (in a tuple's prefix the position tells the next item)
            return frame
        low, high = spec[2], spec[3]
        return (kind, node, min(max(low - count, 0), reach), None if high is None else min(high - count, reach))

    def _key_index(self, node: int) -> KeyIndex:
        index = self._keys.get(node)
        if index is None:
            index = self._keys[node] = KeyIndex(self.nodes[node][1])
        return index

    def _may_close(self, frame: tuple) -> bool:
        return self._key_index(frame[1]).closable[frame[2]]

    def _match_key(self, stack: tuple, matched: bytes, b: int) -> g.State | None:
        """The key being written, ``matched`` so far, and byte ``b``: it must stay the start of a
        property that may come next (from the next one up to the first required one)."""
        _, node, index = stack[-1]
        keys = self._key_index(node)
        seen = matched + bytes((b,))
        depth = len(stack)
        props = self.nodes[node][1]
        fits = None if depth + self.deepest[node] <= g.MAX_DEPTH else (
            lambda j: depth + self.heights[props[j].node] <= g.MAX_DEPTH)
        if keys.may_follow(seen, index, fits):  # (a quote inside a key is escaped: this goes first)
            return (KEY_MATCH, stack, seen, 0)
        if b == 0x22:
            j = keys.exact.get(matched)
            if j is not None and index <= j <= keys.last[index] and (fits is None or fits(j)):
                return (g.COLON, stack[:-1] + (("O", node, j + 1),), self.nodes[node][1][j].node, 0)
        return None


# every grammar still held somewhere (a request's SamplingParams, a compile's future), by its text:
# found again after the LRU below has let it go, never compiled twice while one is alive
_live: weakref.WeakValueDictionary[str, SchemaGrammar] = weakref.WeakValueDictionary()
_live_lock = threading.Lock()


@functools.lru_cache(maxsize=16)  # (a schema at the size bounds and its key indexes: ~11 MB)
def compile_schema(text: str) -> SchemaGrammar:
    """The grammar of the schema in ``text`` (JSON), compiled once per text: kept for the 16 texts
    used last, and for as long as anything holds it (a request's ``SamplingParams``). So a request
    whose schema was compiled on ``compiler_thread`` finds it again on the event loop and in the
    engine's step, however many other schemas came between (found by review: 17 distinct schemas
    in a burst had the event loop compile again, up to ~0.3 s)."""
    with _live_lock:
        grammar = _live.get(text)
    if grammar is None:
        grammar = SchemaGrammar(text)
        with _live_lock:
            grammar = _live.setdefault(text, grammar)
    return grammar


@functools.cache
def compiler_thread() -> ThreadPoolExecutor:
    """One thread for compiling schemas where an event loop would otherwise wait (the gateway's
    checks, the engine process's socket): a schema's patterns can take a few hundred milliseconds
    (``engine.json_regex``'s bound), and a burst of them queues here, not in a loop or in the
    default executor that tokenizing and encoding share (found by QA: eight tenants' slow schemas
    held a plain request 12 s there; compiled on the engine process's socket loop, one held every
    front's stream 5 s)."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="pagegate-schemas")
