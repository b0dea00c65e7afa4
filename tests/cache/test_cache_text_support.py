"""Text the semantic tier cannot read: other scripts, letters MiniLM's vocabulary lacks, accents it
strips, negations in other languages (the third cache QA: such pairs scored 0.90 to 1.0)."""

import pytest
from cache_testlib import answer, chat

from cache.api import CachePolicy
from cache.verifier import Verdict, Verifier


@pytest.fixture(scope="module")
def verifier(embedder):
    return Verifier(vocab=embedder.vocab())


@pytest.mark.parametrize("text,readable", [
    ("How do I reset my password?", True),
    ("¿Cuántos años tienes?", True),  # accents are Latin
    ("Cách nấu cá ngon", True),
    ("Ich bin müde. 🙂", True),  # emoji are no letters: the symbol guard compares them
    ("How do I spell naïve?", True),
    ("¿Quién ganó la 1ª Copa del Mundo?", True),  # (an ordinal indicator: a compatibility "a")
    ("如何打开wifi", False),
    ("Как включить wifi?", False),
    ("Πώς ενεργοποιώ το wifi;", False),
    ("ما هي عاصمة فرنسا؟", False),
    ("What does 你好 mean?", False),  # one foreign word is enough
])
def test_the_guards_read_the_latin_script_only(text, readable):
    assert Verifier.reads(text) is readable


async def test_sees_says_whether_the_vocabulary_holds_every_letter_and_digit(embedder):
    """MiniLM reads any character it lacks as one [UNK]: most CJK characters and non-ASCII digits.
    Cyrillic it has letter by letter (so ``sees`` is true, and ``Verifier.reads`` false); emoji are
    [UNK] too, but are left to the verifier."""
    for text in ("How do I reset my password?", "¿Cuántos años tienes?", "Как включить wifi?",
                 "What does 👍 mean?", "What is π?"):
        assert await embedder.sees(text), text
    for text in ("如何减肥", "今天天气怎么样", "What is ٢+٢?", "What is ２+２?"):
        assert not await embedder.sees(text), text


@pytest.mark.parametrize("q,c,reason", [
    ("Cách nấu cá ngon", "Cách nấu cà ngon", "accent"),
    ("¿Dónde está mi papá?", "¿Dónde está mi papa?", "accent"),
    ("¿Cuántos años tienes?", "¿Cuántos anos tienes?", "accent"),
    ("How do I spell naïve?", "How do I spell naive?", "accent"),
    ("Ich bin müde.", "Ich bin nicht müde.", "negation"),
    ("Je suis fatigué.", "Je ne suis pas fatigué.", "negation"),
    ("J'ose le dire.", "Je n'ose le dire.", "negation"),  # (an elision: "n'")
    ("¿Es seguro comer huevos crudos?", "¿No es seguro comer huevos crudos?", "negation"),
    ("Il negozio è aperto oggi?", "Il negozio non è aperto oggi?", "negation"),
    ("Ik wil koffie.", "Ik wil geen koffie.", "negation"),
    ("¿Cómo encender la luz?", "¿Cómo apagar la luz?", "content"),  # (words off the vocabulary are rare)
])
def test_latin_script_hard_negatives_are_rejected(verifier, q, c, reason):
    assert verifier.check(q, c) == Verdict(False, reason)
    assert verifier.check(c, q) == Verdict(False, reason)


@pytest.mark.parametrize("q,c", [
    ("¿Cuántos años tienes?", "¿Cuántos años tienes tú?"),
    ("¿Cuál es la capital de Perú?", "¿Cuál es la capital del Perú?"),
    ("Quelle est la capitale du Canada ?", "Quelle est la capitale du Canada?"),
    ("Wie alt ist der Eiffelturm?", "Wie alt ist eigentlich der Eiffelturm?"),
    ("What is a café?", "What is a cafe\u0301?"),  # é typed as e + a combining accent
])
def test_latin_script_paraphrases_pass(verifier, q, c):
    assert verifier.check(q, c).ok, verifier.check(q, c)
    assert verifier.check(c, q).ok


def test_accented_words_are_whole_words(verifier):
    a = verifier.analyse("Ich bin müde, años")
    assert {"müde", "años"} <= a.forms and "m" not in a.forms


@pytest.mark.parametrize("stored,asked", [
    ("如何打开wifi", "如何关闭wifi"),  # cosine 1.0: the CJK characters are all [UNK]
    ("如何减肥", "如何增重"),
    ("Как включить wifi?", "Как выключить wifi?"),  # 0.98: Cyrillic as a bag of letters
    ("ما هي عاصمة فرنسا؟", "ما هي عاصمة ألمانيا؟"),
])
async def test_text_the_cache_cannot_read_gets_the_exact_tier_only(make_cache, stored, asked):
    """Through SemanticCache with no guards and a low threshold, so only the gate can refuse: the
    exact repeat hits, the near-duplicate misses with its own reason, and neither entry has a
    vector, so a question the cache can read never matches one either."""
    c = make_cache(verifier=Verifier(guards=frozenset()))
    loose = CachePolicy(threshold=0.1)
    await c.store("acme", chat(stored), answer("stored"), loose)
    assert (await c.lookup("acme", chat(stored), loose)).outcome == "hit"
    r = await c.lookup("acme", chat(asked), loose)
    assert (r.outcome, r.reason, r.storable) == ("miss", "unsupported-text", True)
    assert await c.store_many("acme", [(chat(asked), answer("asked"))], loose) == 1
    assert (await c.lookup("acme", chat(asked), loose)).response["choices"][0]["message"]["content"] == "asked"
    r = await c.lookup("acme", chat("wifi"), loose)
    assert (r.outcome, r.reason) == ("miss", "below-threshold")
    assert c._local.tenant(c.store_.keys("acme")).size() == 0


async def test_latin_script_text_keeps_its_semantic_tier(make_cache):
    """Accents, emoji and other languages of the Latin script are still served by meaning, and
    guarded: an accent-only difference is the verifier's miss."""
    c = make_cache()
    default = CachePolicy(threshold=0.90)
    await c.store("acme", chat("¿Cuántos años tienes?"), answer("30"), default)
    assert (await c.lookup("acme", chat("¿Cuántos años tienes tú?"), default)).outcome == "semantic-hit"
    r = await c.lookup("acme", chat("¿Cuántos anos tienes?"), default)
    assert (r.outcome, r.reason) == ("miss", "verifier")
    await c.store("acme", chat("How do I make fluffy pancakes? 🥞"), answer("Whisk."), default)
    assert (await c.lookup("acme", chat("How do I make fluffy pancakes?"), default)).outcome == "semantic-hit"


def test_unknown_pieces_without_offsets_or_without_an_unknown_token():
    """A slow tokenizer (no offsets) counts every unknown piece, emoji included; a byte-level one
    has no unknown token and sees everything."""
    from cache.embedder import Embedder

    class Slow:
        unk_token_id, is_fast = 100, False

        def __call__(self, text, **kw):
            assert not kw["return_offsets_mapping"]
            return {"input_ids": [1 if word.isascii() else 100 for word in text.split()]}

    class ByteLevel(Slow):
        unk_token_id = None

    assert Embedder._unknown(Slow(), "what does 👍 mean") == 1
    assert Embedder._unknown(Slow(), "plain text") == 0
    assert Embedder._unknown(ByteLevel(), "如何 减肥") == 0
