"""Hard-negative verifier: the second stage after an embedding match.

Sentence embeddings score "enable 2FA" vs "disable 2FA" at ~0.9+, and swapped numbers or
entities not far below: a cosine threshold alone serves wrong answers. A candidate passes
only if every guard agrees the two questions ask the same thing:

    negation   one is negated (not, never, without, n't, avoid, prevent; and nicht, pas, non, …
               of other Latin-script languages, which English text may quote) and the other is not
    antonym    a word on one side has its antonym (or un-/dis-/de- form) on the other only
    number     the numbers (digits, number words, ordinals, dates) differ, in order
    unit       the quantities (number + unit: 10 miles, $5) or the other units named
               (km/miles, °C/°F, USD/EUR, …) differ
    task       the requested operation on the content differs (summarize vs translate …)
    interrogative  each asks for a kind of answer the other does not: a reason, a time, a place,
               a person or an amount, however asked (why = how come = what makes; when = what
               year; where = in which city); "what", "which" and "how" alone are no kind
    entity     a name on one side (capitalised, acronym, code-like, known entity class) is
               missing from the other, nor named there another way (``_ALIASES``: Earth / the
               world)
    relation   the same words stand in a reversed relation (cache/relations.py): the two sides
               of a direction, comparison or position swap places, or subject and object do
    content    both sides carry a rare content word the other lacks (a swap of specific terms;
               rarity from the embedder's word-piece vocabulary rank), or each side a different
               member of one contrast class (time / space, length / width, lunch / dinner,
               always / sometimes, with / before, past / present, today / tomorrow)
    choice     one side offers a choice and the other names one option only: "Is a tomato a fruit
               or a vegetable?" / "Is a tomato a vegetable?" (``_one_option``)
    substitution  the same sentence but for one or two words, a word that matters swapped for one
               that is not its synonym: "too much / too little", "recommended / maximum dose"
               (cache/substitution.py)
    logic      the modal, conditional, scope, order, time or quantity words differ in what they
               mean: "Can / Should I ...", "if / unless", "only / also", "from / before today"
    role       one question asks for its verb's subject and the other for its object, a passive's
               doer or an owner turns round, or a condition and its consequence trade places
    layout     code differs as written, a name in code differs in case, quoted literals or bracket
               runs differ (these three: cache/logic.py)

and three that compare how the two are written, where the embedder sees no difference; they live in
cache/spelling.py, with the written-form normalisation (emphasis, HTML tags, arithmetic in words,
times of day) that every guard reads through:

    accent     a word on each side, the two the same but for accents (cá / cà, años / anos)
    symbol     the symbols differ: operators, code punctuation, options and slices (> / <,
               == / ===, x[1:] / x[:1], ls -a / ls -l, / / ./), and emoji when both texts have
               some (👍 / 👎), which the embedder does not see at all (``spelling.symbols``)
    case       a short word in two capitalised forms (MB / Mb, CO / Co), or, in two texts
               written in prose case, a word that is also a name in lower case on one side
               (Turkey / turkey, US / us); python / Python or NASA / Nasa pass (``spelling.spelt_apart``)

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
("faster" / "slower" as fast / slow, "bigger" as big, "easiest" as easy, and the irregular "best",
"farthest", "most", "fewest" as good, far, many, few), for the antonym lookup only: no other guard
sees them reduced, and no other word is ("water", "offer" stay whole).

Words are read in any script, so that accented Latin words are whole ("müde", "años"), and after
the written forms are made one (``spelling.normalised``: "dısable" is "disable"; shorthand written
out and a request's neutral framing off, cache/shorthand.py: "WW2" is World War II, "Hey, quick
question: how ...?" is "How ...?"). The guards read
English in Latin letters only: ``reads`` says whether a text is that (cache/language.py), and the
cache gives any other text no semantic tier.

Each guard is a few set operations on memoised token analyses (well under a millisecond a pair).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from cache import language
from cache import lexicon as lx
from cache.logic import (
    clauses,
    clauses_apart,
    layout,
    layouts_apart,
    logic_apart,
    logic_words,
    role_of,
    roles_apart,
    turned,
    turned_apart,
)
from cache.persons import Persons, persons, persons_apart
from cache.relations import Relation, Word, relations, reversed_relation
from cache.shorthand import written_out
from cache.spelling import accents_apart, normalised, spelt_apart, symbols
from cache.substitution import QualifierWords, qualified, substituted

_TOKEN = re.compile(
    r"[$€£¥]?\d[\d,]*(?:\.\d+)?[a-zA-Z°%/]*"  # numbers, with attached unit or suffix
    r"|[^\W\d_](?:[^\W_]|['’+#])*(?:-[^\W_]+)*"  # words, in any script (hyphenated compounds kept whole)
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
_IRREGULAR = {stem(w): stem(base) for w, base in lx.IRREGULAR_COMPARATIVES.items()}
# stem -> (class, member); the words of one member are synonyms ("often/frequently")
_CONTRAST = {stem(w): (k, m) for k, members in enumerate(lx.CONTRAST_CLASSES)
             for m, member in enumerate(members.split()) for w in member.split("/")}
# What a question asks for (lexicon.INTERROGATIVES): one named group per kind, its phrases longest
# first, tried only at a word that starts with a phrase's first letter (4x faster than at every word).
_PHRASES = {kind: sorted((p.split() for p in phrases.split("|") if p.strip()), key=len, reverse=True)
            for kind, phrases in lx.INTERROGATIVES.items()}
_FIRST_LETTERS = "".join(sorted({p[0][0] for ps in _PHRASES.values() for p in ps}))
_ASKS = re.compile(rf"\b(?=[{_FIRST_LETTERS}])(?:" + "|".join(
    f"(?P<{kind}>(?:" + "|".join(r"\s+".join(map(re.escape, p)) for p in ps) + r")\b)"
    for kind, ps in _PHRASES.items()) + ")", re.I)
_LIGHT = frozenset(stem(w) for w in lx.LIGHT_WORDS) | lx.LIGHT_WORDS
_SYNONYMS: dict[str, frozenset[int]] = {}
for _g, _group in enumerate(lx.SYNONYM_GROUPS):
    for _w in _group.split("/"):  # (and its comparative and superlative: fastest / quickest)
        for _form in (_w, _w + "r", _w + "st") if _w.endswith("e") else (_w, _w + "er", _w + "est"):
            _SYNONYMS[stem(_form)] = _SYNONYMS.get(stem(_form), frozenset()) | {_g}
_BREAKS = frozenset(".?!;:,")
_QUALIFIER_WORDS = QualifierWords(
    function=_STOP, filler=_FILLER,
    nonrestrictive=frozenset(stem(w) for w in lx.NONRESTRICTIVE),
    classifiers=frozenset(stem(w) for w in lx.CLASSIFIERS),
    adverbs=frozenset(stem(w) for w in lx.QUALIFYING_ADVERBS | lx.QUANTITY_WORDS),
    linking=frozenset(stem(w) for w in lx.LINKING),
    prepositions=frozenset(stem(w) for w in lx.NARROWING_PREPOSITIONS),
    heads={stem(w): None if after is None else frozenset(stem(a) for a in after)
           for w, after in lx.GENERIC_HEADS.items()},
    neutral=frozenset(tuple(stem(w) for w in p.split()) for p in lx.NEUTRAL_PHRASES),
    tails=tuple(tuple(stem(w) for w in t.split()) for t in lx.SETTING_TAILS),
    possessive=frozenset(stem(w) for w in lx.SETTING_POSSESSIVE),
    yes_no=frozenset(stem(w) for w in lx.YES_NO_STARTS),
)
GUARDS = frozenset({"negation", "antonym", "number", "unit", "task", "interrogative", "entity", "relation",
                     "content", "symbol", "case", "accent", "choice", "substitution", "qualifier", "logic", "role",
                     "layout", "person"})
_SENTENCE_END = frozenset(".?!")
# "How does one …?", "Should one …?": the pronoun, not the number
_ASKS_ONE = frozenset("do does did can could should would will must may might".split())
_KEEP_FROM = re.compile(r"\b(?:keep|keeps|keeping|kept)\b[^.?!;:,]*?\bfrom (\w+ing)\b", re.IGNORECASE)
# words in -ing that name things, not doings ("keep food from spring rolls": a review's find)
_ING_NOUNS = frozenset("""spring string thing ring king wing sing sting sling swing bring morning evening ceiling
    building clothing wedding pudding bedding stuffing icing frosting sibling darling during nothing something
    anything everything beijing""".split())
_PRONOUNS = frozenset("i we you he she they it one".split())
# words written in capitals that name nothing ("Is it OK to ...?" is "Is it okay to ...?": a cache QA find)
_NO_NAMES = frozenset({"ok"})
# names for one thing that share no word, each standing for the others in the entity guard ("on
# Earth" / "in the world"). Not America / United States (the continent: "Is Canada part of
# America?"), Britain / United Kingdom (Northern Ireland) nor Mac / macOS (the machine or its
# system): a QA's finds.
_ALIASES = {"earth": "world", "world": "earth"}


def _unnamed(entities: frozenset[str], words: frozenset[str]) -> bool:
    """Whether a name in ``entities`` is neither in ``words`` nor named there another way."""
    return any(e not in words and _ALIASES.get(e) not in words for e in entities)


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
    symbols: tuple[str, ...]  # operator and code-punctuation runs, sorted
    emoji: tuple[str, ...]  # emoji (and other pictographs), sorted
    cased: bool  # the text uses capitals as writing does (not all lower, all upper or Title Case)
    spellings: dict[str, frozenset[str]]  # lower-cased word -> how it is written, off sentence starts
    choices: frozenset[frozenset[str]]  # the two words around each "or": "a fruit or a vegetable"
    asks: frozenset[str]  # what the question asks for: "reason", "time", "place", "person", "amount"
    forms: frozenset[str]  # every word as written, in lower case (accents kept)
    sequence: tuple[tuple[str, bool], ...]  # every word and number in order: (its stem or key, light)
    logic: tuple[tuple[str, ...], ...]  # logic, time and quantity words (cache/logic.py)
    role: tuple[bool | None, bool, bool]  # for its verb's object or subject; a who-question; a passive (cache/logic.py)
    turned: tuple[frozenset[str], frozenset[str]]  # a passive's doer, the owners named (cache/logic.py)
    clauses: tuple[frozenset[str], frozenset[str]] | None  # the words before and after "if" (cache/logic.py)
    layout: tuple  # the code, names in code, bracket runs, quoted literals, whether it holds code (cache/logic.py)
    persons: Persons  # the speaker and the listener named, by role (cache/persons.py)


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
        self.guards = GUARDS if guards is None else guards
        self._memo: OrderedDict[str, _Analysis] = OrderedDict()
        self._memo_size = memo_size

    def reads(self, text: str) -> bool:
        """Whether the guards can read ``text``: English, in Latin letters (``cache.language.reads``).
        Their word lists are English, and so was MiniLM's training: in another script or language
        neither sees the word that changes a question ("Как включить / выключить wifi?" embed at
        0.98, "Hoe zet ik wifi aan / uit?" at 0.946). The cache gives any other text no semantic tier.
        Shorthand is read written out, as the guards read it ("sqrt of 144?" is English), but not
        contractions typed without their apostrophe ("dont" is French too)."""
        return language.reads(written_out(text, contractions=False), self._vocab)

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
        for form in language.inflections(w):
            rank = self._vocab.get(form)
            if rank is not None:
                return rank > self._rare_rank
        return len(w) >= 4  # not a whole word in the vocabulary: rare

    def analyse(self, text: str) -> _Analysis:
        hit = self._memo.get(text)
        if hit is not None:
            return hit
        original, text = text, normalised(text)
        tokens = _TOKEN.findall(text.replace("’", "'"))
        words: set[str] = set()
        forms: set[str] = set()
        numbers: list[str] = []
        units: list[str] = []
        tasks: set[str] = set()
        entities: set[str] = set()
        content: set[str] = set()
        rare: set[str] = set()
        quantities: list[str] = []  # "10 mile": a number with the unit that follows it
        order: list[Word] = []  # every token in order, for the relation guard
        sequence: list[tuple[str, bool]] = []  # the words in order, for the substitution guard
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
        for i_tok, tok in enumerate(tokens):
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
            at_start, starts = starts, False
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
                if low in ("am", "pm") and prev_number:  # a time of day ("7:30 am"), not "I am"
                    st = "@" + low
                words.add(st)
                forms.add(low)
                if low in lx.NEGATIONS or low.endswith("n't") or low in lx.NEGATING_VERBS or low.startswith("n'"):
                    negated = True
                elif low in lx.NUMBER_WORDS and not (low == "one" and i_tok and tokens[i_tok - 1].lower() in _ASKS_ONE):
                    numbers.append(key := _num(str(lx.NUMBER_WORDS[low])))
                    is_number = True
                elif low in lx.ORDINALS:
                    numbers.append(key := "#" + str(lx.ORDINALS[low]))
                elif (low in lx.MONTHS or low in lx.WEEKDAYS or (low in lx.MONTH_ABBR and tok[0].isupper())) and not (
                        low == "may" and tokens[i_tok + 1:i_tok + 2] and tokens[i_tok + 1].lower() in _PRONOUNS):
                    # ("May I ...?" asks what "Can I ...?" does: a QA find read it as the month)
                    numbers.append(key := lx.MONTH_ABBR.get(low, low))
                elif low in lx.UNIT_OF and (prev_number or low not in _AMBIGUOUS_UNITS):
                    key = lx.UNIT_OF[low]
                    _unit(key)
                    is_number = prev_number
                    is_unit = True
                else:
                    if st in _TASK or low in _TASK:
                        tasks.add(_TASK.get(st) or _TASK[low])
                    is_entity = low not in _NO_NAMES and (
                        low in _ENTITY or st in _ENTITY
                        or (tok[0].isupper() and not sentence_start and len(tok) > 1 and low != "i" and not low.startswith("i'")
                            # (a later sentence's first word is a name only if it is no function or
                            # filler word: "... of 144? Thanks!", found by a held-out QA set)
                            and not (at_start and (low in _STOP or st in _STOP or low in _FILLER)))
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
            if is_number or is_unit or is_entity:
                sequence.append((key or low, False))
            else:
                st_ = stem(low)
                sequence.append((st_, low in _LIGHT or st_ in _LIGHT))
            prev_number, prev_unit = is_number, is_unit
            sentence_start = False
        if not negated and any(m.group(1).lower() not in _ING_NOUNS for m in _KEEP_FROM.finditer(text)):
            negated = True  # "keep my glasses from fogging" is "stop them fogging"
        unit_key = (*sorted(quantities), "|", *sorted(units))
        has_lower, has_upper = any(ch.islower() for ch in text), any(ch.isupper() for ch in text)
        cased = has_lower and has_upper and capitalised * 2 <= mid_words  # (Title Case: most words capitalised)
        a = _Analysis(frozenset(words), negated, tuple(numbers), unit_key, frozenset(tasks),
                      frozenset(entities), frozenset(content), frozenset(rare), relations(order),
                      *symbols(text), cased, {w: frozenset(ws) for w, ws in spellings.items()},
                      _choices(order), _asks(text), frozenset(forms), tuple(sequence), logic_words(text),
                      role_of(text), turned(text), clauses(text), layout(original), persons(text))
        self._memo[original] = a
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
        if "antonym" in g and _antonym_swap(q.words, c.words):
            return Verdict(False, "antonym")
        if "number" in g and q.numbers != c.numbers:
            return Verdict(False, "number")
        if "unit" in g and q.units != c.units:
            return Verdict(False, "unit")
        if "task" in g and q.tasks != c.tasks:
            return Verdict(False, "task")
        if "interrogative" in g and (q.asks - c.asks) and (c.asks - q.asks):
            return Verdict(False, "interrogative")
        if "entity" in g and (_unnamed(q.entities, c.words | c.entities) or _unnamed(c.entities, q.words | q.entities)):
            return Verdict(False, "entity")
        if "relation" in g and reversed_relation(q.relations, c.relations):
            return Verdict(False, "relation")
        if "accent" in g and accents_apart(q.forms - c.forms, c.forms - q.forms):
            return Verdict(False, "accent")
        if "content" in g and (((q.rare - c.content) and (c.rare - q.content))
                               or _contrast_swap(q.words - c.words, c.words - q.words)):
            return Verdict(False, "content")
        if "symbol" in g and (q.symbols != c.symbols or (q.emoji and c.emoji and q.emoji != c.emoji)):
            return Verdict(False, "symbol")  # (emoji added or dropped are decoration: compared when both have some)
        if "case" in g and spelt_apart(q.spellings, c.spellings, prose=q.cased and c.cased):
            return Verdict(False, "case")
        if "choice" in g and (_one_option(q, c) or _one_option(c, q)):
            return Verdict(False, "choice")
        if "substitution" in g and substituted(q.sequence, c.sequence, _SYNONYMS):
            return Verdict(False, "substitution")
        if "logic" in g and logic_apart(q.logic, c.logic):
            return Verdict(False, "logic")
        if "role" in g and (roles_apart(q.role, c.role, [w for w, light in q.sequence if not light],
                                        [w for w, light in c.sequence if not light])
                            or turned_apart(q.turned, c.turned, q.forms, c.forms)
                            or clauses_apart(q.clauses, c.clauses)):
            return Verdict(False, "role")
        if "layout" in g and layouts_apart(q.layout, c.layout):
            return Verdict(False, "layout")
        if "qualifier" in g and qualified(q.sequence, c.sequence, _QUALIFIER_WORDS):
            return Verdict(False, "qualifier")
        if "person" in g and persons_apart(q.persons, c.persons):
            return Verdict(False, "person")
        return Verdict(True)


def _choices(order: list[Word]) -> frozenset[frozenset[str]]:
    """The nearest salient word on each side of every "or", inside its clause."""
    found = set()
    for i, w in enumerate(order):
        if w.low != "or":
            continue
        left = next((x.key for x in reversed(order[:i]) if x.key or x.low in _BREAKS), None)
        right = next((x.key for x in order[i + 1:] if x.key or x.low in _BREAKS), None)
        if left and right and left != right:
            found.add(frozenset((left, right)))
    return frozenset(found)


def _one_option(a: _Analysis, b: _Analysis) -> bool:
    """``a`` offers a choice ("a fruit or a vegetable?") and ``b`` names one of its options only."""
    return any(pair not in b.choices and len(pair & b.content) == 1 and len(pair - b.words) == 1
               for pair in a.choices)


def positive_form(w: str) -> str:
    """The base of a comparative or superlative stem of a gradable adjective ("faster" -> "fast",
    "bigger" -> "big", "easiest" -> "easy", and the irregular "best" -> "good", "farthest" -> "far",
    "fewest" -> "few"), else ``w`` unchanged. A stem the antonym table knows itself ("higher",
    "latest", "summer") keeps its own entry."""
    if w in _IRREGULAR:
        return _IRREGULAR[w]
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


_CHOICE = frozenset(stem(w) for w in """which whether who whom difference differences vs versus better best worse
    compare compared""".split())


def _antonym_swap(all_q: frozenset[str], all_c: frozenset[str]) -> bool:
    """A word on one side has its antonym on the other only, and neither side already holds an
    opposite of its own word ("from start to finish" / "from beginning to end" is no swap). "and" /
    "or" count only where neither side asks to choose ("which", "better", "difference", ...)."""
    only_q, only_c = all_q - all_c, all_c - all_q
    if _CHOICE & (all_q | all_c):
        only_q, only_c = only_q - {"and", "or"}, only_c - {"and", "or"}
    base_q, base_c = {positive_form(w) for w in only_q}, {positive_form(w) for w in only_c}
    poles_q, poles_c = {positive_form(w) for w in all_q}, {positive_form(w) for w in all_c}
    for w in base_q:
        for a in _ANTONYMS.get(w, ()):
            if a in base_c and not (_ANTONYMS[w] & poles_q) and not (_ANTONYMS.get(a, set()) & poles_c):
                return True
    return _negated_form(only_q, only_c)


def _contrast_swap(only_q: frozenset[str], only_c: frozenset[str]) -> bool:
    """One side has a member of a contrast class (lexicon.CONTRAST_CLASSES) and the other another
    (not a synonym of it: "often" / "frequently" is one member)."""
    members_q = {_CONTRAST[w] for w in only_q if w in _CONTRAST}
    if not members_q:
        return False
    classes_q = {k for k, _ in members_q}
    return any(m[0] in classes_q and m not in members_q for m in (_CONTRAST.get(w) for w in only_c) if m)


def _asks(text: str) -> frozenset[str]:
    """What ``text`` asks for (``_ASKS``). An all-capitals "WHO" in a text not written in capitals is
    a name (the World Health Organization), not a question word."""
    return frozenset(m.lastgroup for m in _ASKS.finditer(text.replace("’", "'"))
                     if not (m.group().isupper() and len(m.group()) > 2 and not text.isupper()))


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
