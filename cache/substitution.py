"""The substitution guard: two questions that are the same words but for one or two swapped in.

The embedder scores "What happens if I take too much vitamin D?" / "... too little vitamin D?" at
0.96, "the recommended dose" / "the maximum dose" at 0.95, "tax brackets for this year" / "for next
year" at 0.95, and a fixed instruction with a short text to judge ("Classify the sentiment of this
review: The food was great" / "... terrible") higher still: the words they share carry the score,
and the one word that differs carries the meaning. The other guards know classes of such words
(negations, antonyms, numbers, contrast classes); this one reads the shape of the pair instead.

Two texts are a *substitution* when, aligned word by word (stems, ``difflib``), they differ in at most
two words on each side and some difference replaces a word that matters (not a function or filler
word, ``lexicon.LIGHT_WORDS``) by another that is not its synonym (``lexicon.SYNONYM_GROUPS``).
Paraphrases rarely look like that: they reword more than two words ("How do I reset my password?" /
"What are the steps to reset my password?"), swap function words ("How do I" / "How can I"),
prepositions ("in Linux" / "on Linux"), or synonyms ("How often" / "How frequently"), reorder the same
words ("cookie recipe chocolate chip" / "chocolate chip cookie recipe"), or reframe the question at its
start ("When was it built?" / "What year was it built?"), which the interrogative guard reads. Those
pass; a swapped word that matters does not.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

MAX_CHANGED = 2  # words changed on each side, at most, for a pair to be a substitution
MIN_WORDS = 3  # shorter texts are keyword lists: the other guards read them


def substituted(a: tuple[tuple[str, bool], ...], b: tuple[tuple[str, bool], ...],
                synonyms: dict[str, frozenset[int]]) -> bool:
    """Whether ``b`` is ``a`` with a word that matters replaced. ``a`` and ``b`` are the texts' words
    in order as (stem, light); ``synonyms`` maps a stem to the synonym groups it belongs to."""
    if min(len(a), len(b)) < MIN_WORDS:
        return False
    heavy_a, heavy_b = [s for s, light in a if not light], [s for s, light in b if not light]
    if sorted(heavy_a) == sorted(heavy_b):  # the same words that matter: reordered, or function words changed
        # (but two of them trading places around a third is no paraphrase; a passive, "owned by",
        # turns subject and object round itself: the relation guard reads those)
        passive = any(s == "by" for s, _ in (*a, *b))
        return not passive and _swapped(heavy_a, heavy_b)
    sa, sb = [s for s, _ in a], [s for s, _ in b]
    ops = difflib.SequenceMatcher(a=sa, b=sb, autojunk=False).get_opcodes()
    if (sum(i2 - i1 for t, i1, i2, _, _ in ops if t != "equal") > MAX_CHANGED
            or sum(j2 - j1 for t, _, _, j1, j2 in ops if t != "equal") > MAX_CHANGED):
        return False
    framing = 2 if sa[0] in _QUESTION_WORDS and sb[0] in _QUESTION_WORDS else 1
    for tag, i1, i2, j1, j2 in ops:
        if tag != "replace" or (i1 < framing and j1 < framing):  # (how long / how much time: the
            continue  # question's framing, which the interrogative guard reads)
        left = {s for s, light in a[i1:i2] if not light}
        right = {s for s, light in b[j1:j2] if not light}
        if left and right and not _equivalent(left, right, synonyms):
            return True  # (a word that matters for a light one: "stand for" / "mean", "in" / "make up")
    return False


_ARTICLES = {"an": "a"}


@dataclass(frozen=True, slots=True)
class QualifierWords:
    """The word lists of ``qualified``, as stems (``lexicon``: the raw words)."""

    function: frozenset[str]  # stopwords: added, they do not matter (unless also in ``adverbs``)
    filler: frozenset[str]
    nonrestrictive: frozenset[str]
    classifiers: frozenset[str]
    adverbs: frozenset[str]  # QUALIFYING_ADVERBS and QUANTITY_WORDS: added, they always matter
    linking: frozenset[str]
    prepositions: frozenset[str]  # a phrase added mid-question that opens with one restricts it
    heads: dict[str, frozenset[str] | None]  # words that, added before these (None: any linking word), name what was there
    neutral: frozenset[tuple[str, ...]]  # phrases that, added anywhere, leave the question as it was
    tails: tuple[tuple[str, ...], ...]
    possessive: frozenset[str]
    yes_no: frozenset[str]


def qualified(a: tuple[tuple[str, bool], ...], b: tuple[tuple[str, bool], ...], words: QualifierWords) -> bool:
    """Whether one text is the other with a qualifier added: the other's words, in order, with more
    in one or more places (any number: five or more were let pass, found by QA), and no word of it
    dropped or replaced ("a" and "an" are one), where an added
    word changes what is asked. The embedder scores "Is Pluto a planet?" / "Is Pluto a dwarf
    planet?" at 0.91, "Is the water boiling?" / "... almost boiling?" at 0.94, "Are (all) mushrooms
    poisonous?" at 0.97, "Do I (still) need a visa?" at 0.97 (found by QA): the shared words carry
    the score, the added one turns the answer. Let pass, as they leave the answer as it was:
    light and filler words ("please", "exactly"), modifiers that restrict nothing ("the (current)
    CEO", "(main) symptoms", "delete it (permanently)"), a kind named before a name ("the (acronym)
    FOMO"), a generic noun added before a preposition or an article, which names what was there ("a
    SQL (query) to", "days (left) until"; not another noun, "the GDP (growth) of", nor a phrase that
    opens with a preposition, "the GDP (per capita) of", nor an adverb, "take it (daily) with",
    found by QA), the user's own
    setting at the end ("(on my laptop)", "(at home)"), and words framing the question before its
    first shared word ("(Can you tell me) how ..."), unless they turn a yes/no question into another
    ("(Why) is Pluto a planet?")."""
    if min(len(a), len(b)) < MIN_WORDS:
        return False
    # "a" and "an" are one word here: "a car" / "an electric car" adds a word, it replaces none
    sa, sb = [_ARTICLES.get(s, s) for s, _ in a], [_ARTICLES.get(s, s) for s, _ in b]
    diff = [op for op in difflib.SequenceMatcher(a=sa, b=sb, autojunk=False).get_opcodes() if op[0] != "equal"]
    if not diff:
        return False
    if all(op[0] == "insert" for op in diff):
        longer, shorter, spans = b, sa, [(j1, j2) for _, _, _, j1, j2 in diff]
    elif all(op[0] == "delete" for op in diff):
        longer, shorter, spans = a, sb, [(i1, i2) for _, i1, i2, _, _ in diff]
    else:
        return False
    return any(_qualifies([s for s, _ in longer[start:end]], [light for _, light in longer[start:end]],
                          start, end, [s for s, _ in longer], shorter, words) for start, end in spans)


def _qualifies(added: list[str], light: list[bool], start: int, end: int, longer: list[str], shorter: list[str],
               words: QualifierWords) -> bool:
    if tuple(added) in words.neutral:
        return False  # "(on average)", "(in short)", wherever it stands
    matters = [w for w, lt in zip(added, light, strict=True)
               if w in words.adverbs or (w.endswith("ly") and w not in words.nonrestrictive)
               or not (lt or w in words.filler or w in words.nonrestrictive or w in words.function)]
    if start == 0:  # framing: a question word put before a yes/no question turns it, a phrase put
        # before the question that opens with a preposition narrows it: "(For women,) what is the life
        # expectancy in Japan?", and so does a word that matters put before a query of keywords:
        # "(Senior) software engineer salary" (found by re-check QAs); "(Can you tell me) how", an
        # adverb before an instruction ("(Briefly,) explain") do not
        first = shorter[0]  # (``qualified`` reads texts of MIN_WORDS words and more)
        narrows = added[0] in words.prepositions and bool(matters)
        if first in words.yes_no:
            return narrows or any(w in _QUESTION_WORDS for w in added)
        if first in _QUESTION_WORDS:
            return narrows
        return narrows or any(not w.endswith("ly") and w not in words.adverbs for w in matters)  # keywords
    if not matters:
        return False
    if end == len(longer) and (tuple(added) in words.tails or (
            len(added) == 3 and added[0] in words.possessive and added[1] == "my")):
        return False  # the user's own setting: "(on my laptop)", "(at home)"
    if any(w in words.adverbs or w.endswith("ly") for w in matters):
        return True
    if end < len(longer) and added[0] in words.prepositions:
        return True  # a phrase narrowing a noun: "life expectancy (of men) in", "the GDP (per capita) of"
    if end < len(longer) and all(w in words.classifiers for w in matters):
        return False  # "the (planet) Earth"
    # a noun before a linking word names what was there only when it is a generic head before a word
    # it goes with ("a SQL (query) to", "how many days (are left) until"); another is a different
    # thing of it: "the GDP (growth) of", "an (outline of an) essay", "the color (code) of" (found by
    # QA: the broader question's answer was served)
    if end == len(longer) or longer[end] not in words.linking:
        return True
    return not all(w in words.heads and (words.heads[w] is None or longer[end] in words.heads[w]) for w in matters)


_QUESTION_WORDS = frozenset("how what which when where who whom whose why".split())
# what may follow a word in another form of it (invest / investment, safe / safely); -er / -ee and
# the like are other words (employer / employee, trainer / trainee)
_FORM_ENDINGS = frozenset("s es ly al ally ness ity ion ation ment ful".split())


def _swapped(a: list[str], b: list[str]) -> bool:
    """Two words, or two runs of words, that trade places with at least one other word between them,
    the rest in place: "a high fever with a low heart rate" / "a low fever with a high heart rate",
    "Can a landlord sue a tenant" / "Can a tenant sue a landlord" (found by QA), "Did Thomas Edison
    work for Nikola Tesla?" / "Did Nikola Tesla work for Thomas Edison?" (a held-out pair). Moving a
    block to the other end ("chocolate chip cookie recipe" / "recipe chocolate chip cookies") or two
    neighbours ("to my laptop from my phone") is not."""
    if len(a) != len(b) or len(a) > 32:
        return False
    start = 0
    while start < len(a) and a[start] == b[start]:
        start += 1
    end = len(a)
    while end > start and a[end - 1] == b[end - 1]:
        end -= 1
    ma, mb = a[start:end], b[start:end]  # the part that differs: A + between + B against B + between + A
    n = len(ma)
    for la in range(1, n - 1):
        for lb in range(1, n - la):
            first, between, last = ma[:la], ma[la:n - lb], ma[n - lb:]
            if first != last and mb == last + between + first:
                return True
    return False


def _equivalent(left: set[str], right: set[str], synonyms: dict[str, frozenset[int]]) -> bool:
    """Every word that matters on each side has a match on the other: the same word spelt the British
    or the American way (colour / color), a form of it (invest / investment), or a synonym."""
    def matches(x: str, y: str) -> bool:
        short, long_ = sorted((x, y), key=len)
        return (american(x) == american(y) or (long_.startswith(short) and long_[len(short):] in _FORM_ENDINGS)
                or bool(synonyms.get(x, frozenset()) & synonyms.get(y, frozenset())))
    return all(any(matches(x, y) for y in right) for x in left) and all(any(matches(y, x) for x in left) for y in right)


# British spellings as the verifier's stems end (its stemmer drops a final "e": "organis", "centr",
# "catalogu"), and inside them
_BRITISH_ENDINGS = (("isation", "ization"), ("is", "iz"), ("ys", "yz"), ("ogu", "og"), ("tr", "ter"),
                    ("inium", "inum"), ("enc", "ens"))
_BRITISH_INSIDE = (("our", "or"), ("ll", "l"), ("grey", "gray"))


def american(stem: str) -> str:
    """A stem with the British spellings written the American way (colour, centre, organise,
    analyse, catalogue, aluminium, licence, travelled), so a pair spelt both ways reads as one word."""
    for british, us in _BRITISH_ENDINGS:
        if stem.endswith(british):
            stem = stem[: -len(british)] + us
            break
    for british, us in _BRITISH_INSIDE:
        stem = stem.replace(british, us)
    return stem
