"""Hard-negative verifier: the second stage after an embedding match.

Sentence embeddings score "enable 2FA" vs "disable 2FA" at ~0.9+, and swapped numbers or
entities not far below: a cosine threshold alone serves wrong answers. A candidate passes
only if every guard agrees the two questions ask the same thing:

    negation   one is negated (not, never, without, n't, avoid, prevent) and the other is not
    antonym    a word on one side has its antonym (or un-/dis-/de- form) on the other only
    number     the numbers (digits, number words, ordinals, dates) differ, in order
    unit       the quantities (number + unit: 10 miles, $5) or the other units named
               (km/miles, °C/°F, USD/EUR, …) differ
    task       the requested operation on the content differs (summarize vs translate …)
    entity     a name on one side (capitalised, acronym, code-like, known entity class) is
               missing from the other
    relation   the same words stand in a reversed relation (cache/relations.py): the two sides
               of a direction, comparison or position swap places, or subject and object do
    content    both sides carry a rare content word the other lacks (a swap of specific terms;
               rarity from the embedder's word-piece vocabulary rank), or each side a different
               member of one contrast class (time / space, length / width, lunch / dinner)
    symbol     the symbols differ: operators and code punctuation (> / <, == / ===, x[-1] /
               x[1], / / ./) and emoji (👍 / 👎), which the embedder does not see at all
    case       both texts use capitals as writing does, and a word is spelt in different case
               in the two (Turkey / turkey, MB / Mb, CO / Co); a text all in lower case (or
               capitals, or Title Case) says nothing by its case and passes

The ``relation`` guard is the only one that reads word order, and it reads it only around words
that give a pair a direction: "to"/"into" and "from … to" (Celsius to Fahrenheit, English to
French, USD to EUR, string to int, phone to laptop), "than" (a dog bigger than a cat), "north /
left / … of" and "before / after / above / below / behind" (Paris north of London), and a
relating word between two names (the moon orbits the earth; "owned by" flips it), and "in" between
two units ("ounces in a pound" converts a pound to ounces, as "a pound in ounces" does). It rejects a
pair only when a word moves from one side of such a relation to the other and another word
moves back, so a paraphrase that merely reorders its words ("What is the capital of France?" /
"France's capital city is?") or swaps "from A to B" for "to B from A" still passes.

The antonym guard also reads comparatives and superlatives of gradable adjectives as their base
("faster" / "slower" as fast / slow, "bigger" as big, "easiest" as easy), for the antonym lookup
only: no other guard sees them reduced, and no other word is ("water", "offer" stay whole).

Each guard is a few set operations on memoised token analyses (well under a millisecond a pair).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from cache import lexicon as lx
from cache.relations import Relation, Word, relations, reversed_relation

_TOKEN = re.compile(
    r"[$€£¥]?\d[\d,]*(?:\.\d+)?[a-zA-Z°%/]*"  # numbers, with attached unit or suffix
    r"|[A-Za-z][A-Za-z0-9'’+#]*(?:-[A-Za-z0-9]+)*"  # words (hyphenated compounds kept whole)
    r"|[$€£¥%°]"
    r"|[.?!;:,]"  # clause breaks: kept only for the relation guard's clauses
)
_ORDINAL_SUFFIX = re.compile(r"^(\d+)(st|nd|rd|th)$")
_AMBIGUOUS_UNITS = frozenset(w for w in lx.UNIT_OF if len(w) <= 2) | {"may", "min"} | lx.WEAK_UNITS


def stem(w: str) -> str:
    """A deliberately crude suffix stripper, applied identically to both sides."""
    if len(w) > 4 and w.endswith("ies"):
        w = w[:-3] + "y"
    elif len(w) > 5 and w.endswith("ing"):
        w = w[:-3]
    elif len(w) > 4 and w.endswith("ed"):
        w = w[:-2]
    elif len(w) > 4 and (w.endswith(("ses", "xes", "zes", "ches", "shes"))):
        w = w[:-2]
    elif len(w) > 3 and w.endswith("s") and not w.endswith(("ss", "us", "is")):
        w = w[:-1]
    if len(w) > 3 and w.endswith("e"):
        w = w[:-1]
    if len(w) > 3 and w[-1] == w[-2] and w[-1] not in "lsz":
        w = w[:-1]
    return w


_ANTONYMS: dict[str, set[str]] = {}
for _a, _b in lx.ANTONYM_PAIRS:
    if " " in _a or " " in _b:
        continue
    _ANTONYMS.setdefault(stem(_a), set()).add(stem(_b))
    _ANTONYMS.setdefault(stem(_b), set()).add(stem(_a))
_STOP = frozenset(stem(w) for w in lx.STOPWORDS) | lx.STOPWORDS
_FILLER = frozenset(stem(w) for w in lx.FILLER) | lx.FILLER
_ENTITY = frozenset(stem(w) for w in lx.ENTITY_WORDS) | lx.ENTITY_WORDS
_TASK = {stem(w): t for w, t in lx.TASK_OF.items()} | dict(lx.TASK_OF)
_GRADABLE = frozenset(stem(w) for w in lx.GRADABLE)
_CONTRAST = {stem(w): k for k, words in enumerate(lx.CONTRAST_CLASSES) for w in words.split()}
_BREAKS = frozenset(".?!;:,")
_GUARDS = frozenset({"negation", "antonym", "number", "unit", "task", "entity", "relation", "content",
                     "symbol", "case"})
# Runs of characters that are neither word characters nor spaces: operators, code punctuation,
# emoji. A run of ordinary punctuation only (sentence marks, quotes, brackets, dashes) and the
# currency, percent and degree signs (the unit guard reads those) is no symbol; neither is one
# hyphen, apostrophe, ampersand or dot between two letters or digits (e-mail, it's, R&D, 3.5).
_SYMBOL_RUN = re.compile(r"[^\w\s]+")
_PLAIN = frozenset(".,?!;:'\"’‘“”«»„()[]{}…–—-`$€£¥%°•·¿¡")
_JOINERS = frozenset("-'’&.")
_SENTENCE_END = frozenset(".?!")


@dataclass(slots=True, frozen=True)
class Verdict:
    ok: bool
    reason: str | None = None  # the guard that rejected


@dataclass(slots=True)
class _Analysis:
    words: frozenset[str]  # stems of every word token
    negated: bool
    numbers: tuple[str, ...]
    units: tuple[str, ...]
    tasks: frozenset[str]
    entities: frozenset[str]
    content: frozenset[str]  # stems of content words (no stopwords, filler, numbers, units)
    rare: frozenset[str]  # content stems that are rare words
    relations: frozenset[Relation]  # ordered pairs around direction words (cache/relations.py)
    symbols: tuple[str, ...]  # operator / emoji runs, sorted
    cased: bool  # the text uses capitals as writing does (not all lower, all upper or Title Case)
    spellings: dict[str, frozenset[str]]  # lower-cased word -> how it is written, off sentence starts


def _num(s: str) -> str:
    s = s.replace(",", "")
    try:
        v = float(s)
    except ValueError:
        return s
    return str(int(v)) if v.is_integer() else repr(v)


class Verifier:
    """``check(query, candidate)`` -> Verdict. Thread-safe enough for asyncio (no awaits)."""

    def __init__(self, vocab: Mapping[str, int] | None = None, *, rare_rank: int = 15000,
                 guards: frozenset[str] | None = None, memo_size: int = 8192) -> None:
        self._vocab = vocab or {}
        self._rare_rank = rare_rank
        self.guards = _GUARDS if guards is None else guards
        self._memo: OrderedDict[str, _Analysis] = OrderedDict()
        self._memo_size = memo_size

    @property
    def has_vocab(self) -> bool:
        return bool(self._vocab)

    def set_vocab(self, vocab: Mapping[str, int]) -> None:
        """Word-rarity source (word -> rank, e.g. the embedder's word-piece vocabulary)."""
        self._vocab = vocab
        self._memo.clear()

    # -- analysis --------------------------------------------------------------------------
    def _is_rare(self, w: str) -> bool:
        if not self._vocab:
            return False
        for form in (w, w.rstrip("s"), w + "e", w[:-2] if w.endswith("ed") else w,
                     w[:-3] if w.endswith("ing") else w):
            rank = self._vocab.get(form)
            if rank is not None:
                return rank > self._rare_rank
        return len(w) >= 4  # not a whole word in the vocabulary: rare

    def analyse(self, text: str) -> _Analysis:
        hit = self._memo.get(text)
        if hit is not None:
            return hit
        tokens = _TOKEN.findall(text.replace("’", "'"))
        words: set[str] = set()
        numbers: list[str] = []
        units: list[str] = []
        tasks: set[str] = set()
        entities: set[str] = set()
        content: set[str] = set()
        rare: set[str] = set()
        quantities: list[str] = []  # "10 mile": a number with the unit that follows it
        order: list[Word] = []  # every token in order, for the relation guard
        negated = False
        prev_number = prev_unit = False
        sentence_start = True
        spellings: dict[str, set[str]] = {}
        starts = True  # at a sentence's start (the case guard's reading; the entity guard's is the text's)
        capitalised = mid_words = 0

        def _unit(u: str) -> None:
            if prev_number and numbers:  # "10 miles", and "100 degrees fahrenheit" as one quantity
                if prev_unit and quantities:
                    quantities[-1] += " " + u
                else:
                    quantities.append(numbers[-1] + " " + u)
            else:
                units.append(u)
        for tok in tokens:
            if tok in _BREAKS:
                order.append(Word(tok, None, False))
                starts = starts or tok in _SENTENCE_END
                continue
            tok = tok.strip("'")
            if tok.endswith("'s"):  # possessive: "Australia's" is about Australia
                tok = tok[:-2]
            if not tok:
                continue
            low = tok.lower()
            if tok[0].isalpha() and not starts and low != "i" and not low.startswith("i'"):
                spellings.setdefault(low, set()).add(tok)
                if len(tok) > 3:
                    mid_words += 1
                    capitalised += tok[0].isupper()
            starts = False
            is_number = is_unit = is_entity = False
            key: str | None = None
            currency = None
            if low[0] in "$€£¥" and len(low) > 1:
                currency = lx.UNIT_OF[low[0]]
                low = low[1:]
            if low[0].isdigit():
                m = _ORDINAL_SUFFIX.match(low)
                if m:
                    numbers.append("#" + m.group(1))
                else:
                    num = re.match(r"[\d,]*\d(?:\.\d+)?", low).group(0)
                    suffix = low[len(num):]
                    numbers.append(_num(num))
                    if currency:
                        quantities.append(numbers[-1] + " " + currency)
                    elif suffix in lx.UNIT_OF:
                        quantities.append(numbers[-1] + " " + lx.UNIT_OF[suffix])
                    elif suffix:
                        entities.add(low)  # "2fa", "gpt4"-like identifiers
                key = low if low in entities else numbers[-1]
                prev_number = is_number = True
            elif low in lx.UNIT_OF and low[0] in "$€£¥%°":
                key = lx.UNIT_OF[low]
                _unit(key)
                is_number = prev_number  # a unit keeps the quantity open for the next unit
                is_unit = True
            else:
                st = stem(low)
                words.add(st)
                if low in lx.NEGATIONS or low.endswith("n't") or low in lx.NEGATING_VERBS:
                    negated = True
                elif low in lx.NUMBER_WORDS:
                    numbers.append(key := _num(str(lx.NUMBER_WORDS[low])))
                    is_number = True
                elif low in lx.ORDINALS:
                    numbers.append(key := "#" + str(lx.ORDINALS[low]))
                elif low in lx.MONTHS or low in lx.WEEKDAYS or (low in lx.MONTH_ABBR and tok[0].isupper()):
                    numbers.append(key := lx.MONTH_ABBR.get(low, low))
                elif low in lx.UNIT_OF and (prev_number or low not in _AMBIGUOUS_UNITS):
                    key = lx.UNIT_OF[low]
                    _unit(key)
                    is_number = prev_number
                    is_unit = True
                else:
                    if st in _TASK or low in _TASK:
                        tasks.add(_TASK.get(st) or _TASK[low])
                    is_entity = (
                        low in _ENTITY or st in _ENTITY
                        or (tok[0].isupper() and not sentence_start and len(tok) > 1 and low != "i")
                        or (len(tok) >= 2 and tok.isupper())
                        or any(c.isdigit() for c in tok) or "+" in tok or "#" in tok
                    )
                    if is_entity:
                        entities.add(st)
                        key = st
                    if st not in _STOP and low not in _STOP and st not in _FILLER and low not in _FILLER:
                        content.add(st)
                        key = st
                        if self._is_rare(low):
                            rare.add(st)
            # (an everyday unit word counts as a unit here without a number: "cups in a tablespoon")
            order.append(Word(low, key, is_entity, is_unit or low in lx.WEAK_UNITS))
            prev_number, prev_unit = is_number, is_unit
            sentence_start = False
        unit_key = (*sorted(quantities), "|", *sorted(units))
        has_lower, has_upper = any(ch.islower() for ch in text), any(ch.isupper() for ch in text)
        cased = has_lower and has_upper and capitalised * 2 <= mid_words  # (Title Case: most words capitalised)
        a = _Analysis(frozenset(words), negated, tuple(numbers), unit_key, frozenset(tasks),
                      frozenset(entities), frozenset(content), frozenset(rare), relations(order),
                      _symbols(text), cased, {w: frozenset(forms) for w, forms in spellings.items()})
        self._memo[text] = a
        if len(self._memo) > self._memo_size:
            self._memo.popitem(last=False)
        return a

    # -- decision --------------------------------------------------------------------------
    def check(self, query: str, candidate: str) -> Verdict:
        if query == candidate:
            return Verdict(True)
        q, c = self.analyse(query), self.analyse(candidate)
        g = self.guards
        if "negation" in g and q.negated != c.negated:
            return Verdict(False, "negation")
        if "antonym" in g and _antonym_swap(q.words - c.words, c.words - q.words):
            return Verdict(False, "antonym")
        if "number" in g and q.numbers != c.numbers:
            return Verdict(False, "number")
        if "unit" in g and q.units != c.units:
            return Verdict(False, "unit")
        if "task" in g and q.tasks != c.tasks:
            return Verdict(False, "task")
        if "entity" in g and ((q.entities - c.words - c.entities) or (c.entities - q.words - q.entities)):
            return Verdict(False, "entity")
        if "relation" in g and reversed_relation(q.relations, c.relations):
            return Verdict(False, "relation")
        if "content" in g and (((q.rare - c.content) and (c.rare - q.content))
                               or _contrast_swap(q.content - c.content, c.content - q.content)):
            return Verdict(False, "content")
        if "symbol" in g and q.symbols != c.symbols:
            return Verdict(False, "symbol")
        if "case" in g and q.cased and c.cased and _spelt_apart(q.spellings, c.spellings):
            return Verdict(False, "case")
        return Verdict(True)


def _symbols(text: str) -> tuple[str, ...]:
    """The text's symbol runs (see ``_SYMBOL_RUN``), sorted: a paraphrase may move them."""
    found = []
    for m in _SYMBOL_RUN.finditer(text):
        run, start, end = m.group(), m.start(), m.end()
        if len(run) == 1 and run in _JOINERS and 0 < start and end < len(text) \
                and text[start - 1].isalnum() and text[end].isalnum():
            continue  # e-mail, it's, R&D, 3.5
        # a "-" right before a letter or digit and not after one is a sign or an option ("-1", "x[-1]", "-rf")
        signed = run[-1] == "-" and end < len(text) and text[end].isalnum() \
            and (len(run) > 1 or start == 0 or not text[start - 1].isalnum())
        if signed or not all(ch in _PLAIN for ch in run):
            found.append(run)
    return tuple(sorted(found))


def _spelt_apart(a: dict[str, frozenset[str]], b: dict[str, frozenset[str]]) -> bool:
    """A word both texts write off a sentence start, in different case (Turkey / turkey)."""
    if len(b) < len(a):
        a, b = b, a
    return any(forms != b[w] for w, forms in a.items() if w in b)


def positive_form(w: str) -> str:
    """The base of a comparative or superlative stem of a gradable adjective ("faster" -> "fast",
    "bigger" -> "big", "easiest" -> "easy"), else ``w`` unchanged. A stem the antonym table knows
    itself ("higher", "latest", "summer") keeps its own entry."""
    if w in _ANTONYMS:
        return w
    for suffix in ("est", "er"):
        if len(w) > len(suffix) + 2 and w.endswith(suffix):
            base = w[:-len(suffix)]
            break
    else:
        return w
    forms = [base]
    if base.endswith("i"):
        forms.insert(0, base[:-1] + "y")  # easi-er -> easy
    if base[-1] == base[-2]:
        forms.insert(0, base[:-1])  # bigg-er -> big
    return next((f for f in forms if f in _GRADABLE), w)


def _antonym_swap(only_q: set[str] | frozenset[str], only_c: set[str] | frozenset[str]) -> bool:
    if _antonym_pair({positive_form(w) for w in only_q}, {positive_form(w) for w in only_c}):
        return True
    return _negated_form(only_q, only_c)


def _contrast_swap(only_q: frozenset[str], only_c: frozenset[str]) -> bool:
    """One side has a member of a contrast class (lexicon.CONTRAST_CLASSES) and the other another."""
    classes_q = {_CONTRAST[w] for w in only_q if w in _CONTRAST}
    return any(_CONTRAST.get(w) in classes_q for w in only_c)


def _antonym_pair(only_q: set[str], only_c: set[str]) -> bool:
    return any(_ANTONYMS.get(w, frozenset()) & only_c for w in only_q)


def _negated_form(only_q: set[str] | frozenset[str], only_c: set[str] | frozenset[str]) -> bool:
    for w in only_q:
        if len(w) >= 3:
            for p in lx.NEGATING_PREFIXES:
                if p + w in only_c:
                    return True
    for w in only_c:
        if len(w) >= 3:
            for p in lx.NEGATING_PREFIXES:
                if p + w in only_q:
                    return True
    return False
