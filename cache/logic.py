"""Logic and layout guards of the hard-negative verifier (cache/verifier.py): the small words that
decide what a question asks, and the layout of code, which the embedder weighs as nothing.

A cache QA's new hard negatives (the ``qa6`` split of bench/cache_pairs.jsonl) were served one in
four at 0.90, almost all of one of these kinds, each scoring 0.93 to 1.00:

    logic    the modal, conditional, scope, quantifier, order and time words differ: "Can / Should I
             eat sushi while pregnant?", "... if / unless I cancel?", "Does the plan only / also cover
             dental?", "Are both / Is either parent required ...", "in (reverse) chronological order",
             "two weeks from / before today" (``logic_words``)
    role     one who/what question asks for the subject and the other for the object of the same
             verb: "Who taught Plato?" / "Who did Plato teach?" (``asks_for_object``)
    layout   code whose meaning lies in how it is written: the code under a question must be the
             same, as written (its indentation: "print(x)" inside the loop or after it; 'x' / x;
             Value / value), and anywhere, the case of a format code or option (%Y / %y, -R / -r), a
             quoted literal ('hello' / 'hello world'), nested brackets (len([[]]) / len([]))
             (``layout``)

The logic words are a closed class, so the guard compares them as a multiset: a paraphrase keeps
them, or trades one for another of the same meaning, which they are mapped to first ("have to",
"need", "required", "mandatory" and "must" are one; "can", "could" and "may" before "I" or "we" ask permission alike). Questions
that begin with "how" or "where" are about a way or a place, whatever their modal ("How can / do /
should I reset my password?"): their modals are not compared; nor, in a question for a thing, a
person or a time, are advice and obligation ("What should / must / do I need to bring?"), though
permission and possibility still are ("What can / should I eat while pregnant?"). A favour asked
("Can you explain ...?") is the request's framing, not a modal; "Is it possible / okay / safe to ...?"
and "able to" ask what "can" asks. Words that are also filler ("just", "any", "some",
"all", "every", "each", "most") are left out: "Are there any side effects?" asks what "Are there side effects?" does.
"""

from __future__ import annotations

import re
from collections import Counter

_WORD = re.compile(r"[a-z]+")
_MODALS = frozenset("can could may might must shall should will would ought".split())
_CONTRACTED = {"won": "will", "shan": "shall", "couldn": "could", "shouldn": "should", "wouldn": "would",
               "mustn": "must", "ca": "can"}  # (won't, can't: the negation guard reads the "n't")
_OBLIGATION = frozenset("have has had got".split())  # "have to", "has to": must
_LOGIC = {"unless": "unless", "except": "except", "only": "only", "solely": "only", "exclusively": "only",
          "also": "also", "even": "even", "both": "both", "either": "either", "neither": "neither",
          "none": "none", "reverse": "reverse", "reversed": "reverse",
          "backwards": "reverse", "backward": "reverse", "ascending": "ascending", "increasing": "ascending",
          "descending": "descending", "decreasing": "descending"}
_TIME = frozenset("before after ago since until till from".split())
_ADVISED = frozenset("better best advisable wise".split())
_PERMITTED = frozenset("possible okay ok alright safe able allowed".split())
_ASKING = frozenset("what which who whom".split())  # (not "when": "When I enter the US, must I ...?")
_NEEDED = frozenset("need needs needed necessary required mandatory obligatory compulsory".split())
# what a favour asks for after "Can / could / will / would you": "Can you learn guitar at 40?" asks
# whether one can, "Can you explain ...?" asks for the explanation
_FAVOURS = frozenset("please explain tell help recommend give write show list describe suggest summarize "
                     "summarise translate provide make create check fix find name compare define outline "
                     "draft generate rewrite teach clarify elaborate walk".split())
_WH = frozenset("who whom what which".split())
_DO = frozenset("do does did".split())
# what follows a subject question's wh-word when it is no verb of its own: "What is / has / can ..."
_NOT_A_VERB = frozenset("is are was were s has have had can could will would should shall may might must "
                        "kind kinds type types sort sorts of".split())


def logic_words(text: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The question's logic words, each as the meaning it stands for, and its time words (before,
    after, since, from, ...), each sorted (multisets)."""
    words = _WORD.findall(text.lower())
    way = bool(words) and words[0] in ("how", "where")  # a way or a place, whatever the modal
    wh = bool(words) and words[0] in _ASKING  # "What should / must / do I need to bring?": one question
    found: list[str] = []
    timed: list[str] = []

    def modal(meaning: str) -> None:
        if not (way or (wh and meaning in ("must", "should"))):
            found.append(meaning)

    for i, w in enumerate(words):
        nxt = words[i + 1] if i + 1 < len(words) else ""
        w = _CONTRACTED.get(w, w) if nxt == "t" else w
        if w in _MODALS:
            after = words[i + 2] if i + 2 < len(words) else ""
            if nxt == "you" and w in ("can", "could", "will", "would") and after in _FAVOURS:
                continue  # a favour asked ("Can you explain ...?"): the request itself, not a modal
            modal("can" if nxt in ("i", "we") and w in ("can", "could", "may") else
                  "should" if w == "ought" else w)
        elif (w in _OBLIGATION and nxt == "to") or w in _NEEDED:  # "have to", "need (to)", "required"
            modal("must")
        elif w in _PERMITTED and nxt in ("to", "for"):  # "Is it possible / okay / safe to ...?", "able to"
            modal("can")
        elif w == "way" and nxt == "to" and "there" in words[max(0, i - 3):i]:  # "Is there a way to ...?"
            modal("can")
        elif w in _ADVISED and nxt == "to":  # "Is it better to ...?": should
            modal("should")
        elif w in _LOGIC:
            found.append(_LOGIC[w])
        elif w in _TIME:
            timed.append(w)
    # time words count when both sides have some: "two weeks from / before today", not "when I wake
    # up" / "after waking up"
    return tuple(sorted(found)), tuple(sorted(timed))


def asks_for_object(text: str) -> bool | None:
    """For a who/what/which question, whether it asks for the object of its verb ("Who did Plato
    teach?", "Whom ...") rather than its subject ("Who taught Plato?"); None for any other text, or
    when the word after the wh-word is no verb ("What is ...", "Which kind of ...")."""
    words = _WORD.findall(text.lower())
    if len(words) < 3 or words[0] not in _WH:
        return None
    if words[0] == "whom" or words[1] in _DO:
        return True
    if words[0] == "who":
        return None if words[1] in _NOT_A_VERB else False
    return False if words[1].endswith("ed") else None  # ("Which strings ...": a noun, not a verb)


_QUOTED = re.compile(r"(?<!\w)'([^'\n]{1,200})'(?!\w)|\"([^\"\n]{1,200})\"|`([^`\n]{1,200})`")
_CODE_CASE = re.compile(r"(?<![\w%$-])[%$-]{1,2}[A-Za-z]\w*")  # %Y, $HOME, -R, --Force
_BRACKETS = re.compile(r"[()\[\]{}]{2,}")


_CODE_LINE = re.compile(r"^[ \t]|[=(){}\[\];$<>]")


def layout(text: str) -> tuple:
    """What code's meaning hangs on that the embedder does not read: the code under a question (its
    lines after the first, when one of them looks like code: indented, or with code punctuation), as
    written; format codes, variables and options as written; quoted literals; runs of brackets."""
    lines = [line.rstrip() for line in text.split("\n") if line.strip()]
    code = tuple(lines[1:]) if any(_CODE_LINE.search(line) for line in lines[1:]) else ()
    quoted = Counter(next(g for g in m.groups() if g is not None).strip().rstrip(".?!,;:")  # ('Wie alt ...?')
                     for m in _QUOTED.finditer(text))
    return (code, tuple(sorted(_CODE_CASE.findall(text))), tuple(sorted(_BRACKETS.findall(text))),
            tuple(sorted(quoted.elements())))


def layouts_apart(a: tuple, b: tuple) -> bool:
    """Whether two texts' ``layout`` differ where it counts: the code under the question when either
    has some (a paraphrase rewords the question, not the code: "print(x)" inside the loop or after
    it, 'x' or x, Value or value), the code tokens and bracket runs always, quoted literals when both
    quote something."""
    (code_a, tok_a, br_a, q_a), (code_b, tok_b, br_b, q_b) = a, b
    return ((bool(code_a or code_b) and code_a != code_b) or tok_a != tok_b or br_a != br_b
            or (bool(q_a and q_b) and q_a != q_b))


def logic_apart(a: tuple[tuple[str, ...], tuple[str, ...]], b: tuple[tuple[str, ...], tuple[str, ...]]) -> bool:
    """Whether two texts' ``logic_words`` differ: the logic words always, the time words when both
    texts have some."""
    return a[0] != b[0] or (bool(a[1] and b[1]) and a[1] != b[1])
