"""The hard-negative verifier: wrong candidates rejected, real paraphrases kept."""

import pytest

from cache import lexicon as lx
from cache.verifier import _ANTONYMS, Verdict, Verifier, positive_form, stem


@pytest.fixture(scope="module")
def verifier(embedder):
    return Verifier(vocab=embedder.vocab())


@pytest.mark.parametrize("q,c,reason", [
    ("How do I enable two-factor authentication?", "How do I disable two-factor authentication?", "antonym"),
    ("How do I install numpy on Linux?", "How do I uninstall numpy on Linux?", "antonym"),
    ("How do I turn on dark mode?", "How do I turn off dark mode?", "antonym"),
    ("Should I sell my shares now?", "Should I buy my shares now?", "antonym"),
    ("Why is my laptop charging?", "Why is my laptop not charging?", "negation"),
    ("Can I take ibuprofen with alcohol?", "Can I take ibuprofen without alcohol?", "negation"),
    ("What is 15% of 240?", "What is 24% of 150?", "number"),
    ("Is a 30 year mortgage better?", "Is a 15 year mortgage better?", "number"),
    ("What happened in 1989 in Berlin?", "What happened in 1991 in Berlin?", "number"),
    ("How many calories are in three eggs?", "How many calories are in two eggs?", "number"),
    ("What is the second law of thermodynamics?", "What is the third law of thermodynamics?", "number"),
    ("Convert 10 miles to kilometers", "Convert 10 kilometers to miles", "unit"),
    ("What is 100 Fahrenheit in Celsius?", "What is 100 Celsius in Fahrenheit?", "unit"),
    ("How much is 50 USD?", "How much is 50 EUR?", "unit"),
    ("What is the capital of France?", "What is the capital of Germany?", "entity"),
    ("How do I reverse a list in Python?", "How do I reverse a list in JavaScript?", "entity"),
    ("Translate 'good night' into Spanish", "Translate 'good night' into Italian", "entity"),
    ("Who founded Microsoft?", "Who founded Apple?", "entity"),
    ("Summarize this paragraph: the market fell sharply today.",
     "Translate this paragraph: the market fell sharply today.", "task"),
    ("Fix the bug in this function: def f(x): return x+1",
     "Write tests for this function: def f(x): return x+1", "task"),
])
def test_hard_negatives_are_rejected(verifier, q, c, reason):
    v = verifier.check(q, c)
    assert not v.ok and v.reason == reason
    assert not verifier.check(c, q).ok  # symmetric


@pytest.mark.parametrize("q,c", [
    ("How do I reset my password?", "What are the steps to reset my password?"),
    ("How do I enable two-factor authentication?", "How can I turn on two-factor authentication?"),
    ("What is the capital of France?", "Which city is the capital of France?"),
    ("How do I reverse a list in Python?", "What's the way to reverse a Python list?"),
    ("Why is my laptop not charging?", "My laptop isn't charging, why?"),
    ("What is 15% of 240?", "Calculate 15% of 240"),
    ("Convert 10 miles to kilometers", "How many kilometers is 10 miles? Convert it"),
    ("Can you explain how photosynthesis works?", "How does photosynthesis work?"),
])
def test_paraphrases_pass(verifier, q, c):
    assert verifier.check(q, c).ok, verifier.check(q, c)


@pytest.mark.parametrize("q,c", [
    ("How do I convert Celsius to Fahrenheit?", "How do I convert Fahrenheit to Celsius?"),
    ("Translate this sentence from English to French.", "Translate this sentence from French to English."),
    ("Convert USD to EUR.", "Convert EUR to USD."),
    ("Is a dog bigger than a cat?", "Is a cat bigger than a dog?"),
    ("How do I convert a string to an int in Python?", "How do I convert an int to a string in Python?"),
    ("How do I convert JSON to XML?", "How do I convert XML to JSON?"),
    ("How do I transfer photos from my phone to my laptop?", "How do I transfer photos from my laptop to my phone?"),
    ("How do I transfer photos to my laptop from my phone?", "How do I transfer photos from my laptop to my phone?"),
    ("Is Paris north of London?", "Is London north of Paris?"),
    ("Does the moon orbit the earth?", "Does the earth orbit the moon?"),
    ("How to convert Celsius to Fahrenheit?", "How to convert Fahrenheit to Celsius?"),  # "how to" is no relation
    ("Is it faster to walk than to drive?", "Is it faster to drive than to walk?"),
    ("Does lunch come before dinner?", "Does dinner come before lunch?"),
])
def test_direction_swaps_are_rejected(verifier, q, c):
    """Same words, opposite meaning: word sets cannot tell them apart, the relation guard can."""
    assert verifier.check(q, c) == Verdict(False, "relation")
    assert verifier.check(c, q) == Verdict(False, "relation")


@pytest.mark.parametrize("q,c", [
    ("What is the capital of France?", "France's capital city is?"),
    ("How do I move files from my phone to my laptop?", "How do I move files to my laptop from my phone?"),
    ("How do I convert Celsius to Fahrenheit?", "What's the way to convert from Celsius to Fahrenheit?"),
    ("In Python, how do I sort a list?", "How do I sort a list in Python?"),
    ("Does Google own YouTube?", "Is YouTube owned by Google?"),  # passive: subject and object swap back
    ("Compare Python and Java for web development.", "For web development, compare Java and Python."),
    ("How do I stop my dog from barking at night?", "How can I get my dog to stop barking at night?"),
    ("How do I get to London from Paris?", "How do I go from Paris to London?"),
])
def test_paraphrases_that_reorder_words_pass(verifier, q, c):
    assert verifier.check(q, c).ok, verifier.check(q, c)
    assert verifier.check(c, q).ok


@pytest.mark.parametrize("q,c", [
    ("Why is my laptop getting faster?", "Why is my laptop getting slower?"),
    ("Is it easier to learn Spanish or French?", "Is it harder to learn Spanish or French?"),
    ("Why are TVs getting larger?", "Why are TVs getting smaller?"),
    ("Why are TVs getting bigger?", "Why are TVs getting smaller?"),
    ("What is the easiest language to learn?", "What is the hardest language to learn?"),
    ("Which is the cheapest flight?", "Which is the most expensive flight?"),
    ("Is a thinner laptop better?", "Is a thicker laptop better?"),
])
def test_comparative_opposites_are_rejected(verifier, q, c):
    assert verifier.check(q, c) == Verdict(False, "antonym")
    assert verifier.check(c, q) == Verdict(False, "antonym")


@pytest.mark.parametrize("word,base", [
    ("faster", "fast"), ("fastest", "fast"), ("bigger", "big"), ("biggest", "big"), ("easier", "easy"),
    ("easiest", "easy"), ("larger", "large"), ("safer", "safe"), ("hotter", "hot"), ("thinner", "thin"),
    ("smaller", "small"), ("closest", "close"), ("nearest", "near"), ("simpler", "simple"),
    # irregular: read as their base all the same
    ("best", "good"), ("worse", "bad"), ("farthest", "far"), ("further", "far"), ("most", "many"),
    ("fewest", "few"), ("less", "few"),
    # not comparatives of a gradable adjective, or known to the antonym table as they are
    ("water", "water"), ("offer", "offer"), ("banner", "banner"), ("easter", "easter"), ("summer", "summer"),
    ("higher", "higher"), ("latest", "latest"), ("user", "user"), ("closet", "closet"),
])
def test_positive_form_reduces_comparatives_only(word, base):
    assert positive_form(stem(word)) == stem(base)


def test_comparatives_are_reduced_for_the_antonym_lookup_only(verifier):
    # ("a large bottle" is a qualifier added, refused as such: not as an antonym of "small")
    assert verifier.check("How much water is in a bottle?", "How much water is in a large bottle?").reason == "qualifier"
    assert verifier.analyse("Why is it faster?").words == frozenset({"why", "is", "it", "faster"})


def test_gradable_adjectives_all_have_antonyms():
    assert {stem(w) for w in lx.GRADABLE} <= set(_ANTONYMS)


# Found by QA at the default threshold 0.90 (cosine 0.90 to 0.95): the unit swap of "X in a Y" and
# a swap of two common words of one kind (time / space) passed every guard.
@pytest.mark.parametrize("q,c,reason", [
    ("How many ounces in a pound?", "How many pounds in an ounce?", "relation"),
    ("How many grams in a kilogram?", "How many kilograms in a gram?", "relation"),
    ("How many feet in a mile?", "How many miles in a foot?", "relation"),
    ("How many ounces in a pound?", "Convert ounces to pounds", "relation"),
    ("What is a pound in ounces?", "What is an ounce in pounds?", "relation"),
    # everyday unit words with no number before them (the review's finds, cosine 0.92 to 0.96)
    ("How many tablespoons in a cup?", "How many cups in a tablespoon?", "relation"),
    ("How many minutes in an hour?", "How many hours in a minute?", "relation"),
    ("How many days in a week?", "How many weeks in a day?", "relation"),
    ("What is the time complexity of mergesort?", "What is the space complexity of mergesort?", "content"),
    ("What is the time complexity of quicksort?", "What is the space complexity of quicksort?", "content"),
    ("What is the length of the room?", "What is the width of the room?", "content"),
])
def test_qa_hard_negatives_are_rejected(verifier, q, c, reason):
    assert verifier.check(q, c) == Verdict(False, reason)
    assert verifier.check(c, q) == Verdict(False, reason)


@pytest.mark.parametrize("q,c", [
    ("How many ounces in a pound?", "How many ounces are there in a pound?"),
    ("How many ounces in a pound?", "What is a pound in ounces?"),
    ("How many ounces in a pound?", "Convert a pound to ounces"),
    ("How many ounces in a pound?", "How many ounces make up a pound?"),
    ("How many pounds in an ounce?", "How many pounds are in an ounce?"),
    ("How many minutes in an hour?", "How many minutes are there in an hour?"),
    ("How many cups in a gallon?", "How many cups make a gallon?"),
    ("What is 100 Fahrenheit in Celsius?", "Convert 100 Fahrenheit to Celsius"),
    ("What is the time complexity of mergesort?", "What is mergesort's time complexity?"),
    ("What is the time complexity of quicksort?", "How much time does quicksort take, in big-O terms?"),
    ("Is Pluto a planet?", "Is Pluto considered a planet?"),
])
def test_qa_paraphrases_pass(verifier, q, c):
    assert verifier.check(q, c).ok, verifier.check(q, c)
    assert verifier.check(c, q).ok


# Found by the second cache QA (2026-12-03) at the default threshold: a multi-word comparative's
# "than" swap, case-only differences (cosine 1.0), emoji (invisible to the embedder), operators
# and code punctuation, and antonyms the lexicon lacked.
@pytest.mark.parametrize("q,c,reason", [
    ("Is Mercury closer to the sun than Venus?", "Is Venus closer to the sun than Mercury?", "relation"),
    ("Is Tokyo more expensive to live in than Seoul?", "Is Seoul more expensive to live in than Tokyo?", "relation"),
    ("Tell me about Turkey.", "Tell me about turkey.", "case"),
    ("How many bytes in 1 MB?", "How many bytes in 1 Mb?", "case"),
    ("What is the molar mass of CO?", "What is the molar mass of Co?", "case"),
    ("What does 👍 mean?", "What does 👎 mean?", "symbol"),
    ("What does 😀 mean in a text message?", "What does 😢 mean in a text message?", "symbol"),
    ("Is 7 > 5?", "Is 7 < 5?", "symbol"),
    ("Is x >= 10 true when x is 10?", "Is x > 10 true when x is 10?", "symbol"),
    ("What is the difference between == and === in JavaScript?",
     "What is the difference between = and == in JavaScript?", "symbol"),
    ("What does rm -rf / do?", "What does rm -rf ./ do?", "symbol"),
    ("What does print(x[-1]) print for x = [1, 2, 3]?", "What does print(x[1]) print for x = [1, 2, 3]?", "symbol"),
    ("Is it -5 degrees outside?", "Is it 5 degrees outside?", "symbol"),
    ("What year did World War 1 start?", "What year did World War 1 end?", "antonym"),
    ("What time does the sun rise in June?", "What time does the sun set in June?", "antonym"),
    ("Set an alarm for 7:30 am.", "Set an alarm for 7:30 pm.", "antonym"),
    ("What is the dose of ibuprofen for a child?", "What is the dose of ibuprofen for an adult?", "antonym"),
    ("What is the dose of paracetamol for adults?", "What is the dose of paracetamol for children?", "antonym"),
    ("Should I take ibuprofen or acetaminophen for a headache?",
     "Should I take ibuprofen and acetaminophen for a headache?", "antonym"),
    ("How long can I leave cooked chicken in the fridge?", "How long can I leave raw chicken in the fridge?",
     "antonym"),
    # (from the guards' own QA set: slices, options, operators of punctuation, times written with dots,
    # capitonyms, an all-caps stopword, short units in two capitalised forms)
    ("What is x[1:] in Python?", "What is x[:1] in Python?", "symbol"),
    ("What does ls -a do?", "What does ls -l do?", "symbol"),
    ("What does git push -f do?", "What does git push -u do?", "symbol"),
    ("What does the ?? operator do in JavaScript?", "What does the ?. operator do in JavaScript?", "symbol"),
    ("Set an alarm for 6 a.m.", "Set an alarm for 6 p.m.", "antonym"),
    ("Is Apple a good investment?", "Is apple a good investment?", "case"),
    ("Is it legal to work in the US?", "Is it legal to work in the us?", "entity"),  # ("US": the United States)
    ("Is 100 Mbps fast?", "Is 100 MBps fast?", "case"),
    # (the re-check's finds)
    ("What time does the meeting start?", "What time does the meeting finish?", "antonym"),
    ("Is 5 greater than 3?", "Is 5 less than 3?", "symbol"),
    ("What does this mean: 👍", "What does this mean: 👎", "symbol"),
    ("Is a tomato a fruit or a vegetable?", "Is a tomato a vegetable?", "choice"),
    ("Should I eat before or after a workout?", "Should I eat after a workout?", "choice"),
])
def test_second_qa_hard_negatives_are_rejected(verifier, q, c, reason):
    assert verifier.check(q, c) == Verdict(False, reason)
    assert verifier.check(c, q) == Verdict(False, reason)


# What the symbol and case guards must let through: case that says nothing (all lower case, Title
# Case, a sentence's first word), and punctuation that is no symbol (hyphens, apostrophes, decimal
# points, currency and percent signs, sentence marks, quotes, brackets, a dash between words).
@pytest.mark.parametrize("q,c", [
    ("what is the capital of france", "What is the capital of France?"),
    ("What Is The Capital Of France?", "What is the capital of France?"),
    ("Turkey: what is its capital?", "What is the capital of Turkey?"),
    ("What's the state-of-the-art in NLP?", "What is the state of the art in NLP?"),
    ("Is 3.5 bigger than 3.25?", "Is 3.5 bigger than 3.25??"),
    ("What is 15% of $240?", "What's 15% of $240!"),
    ("Explain the 'self' keyword (in Python).", "Explain the self keyword in Python"),
    ("Python - what is it?", "Python: what is it?"),
    ("How do I use git reset --hard?", "How do I run git reset --hard?"),
    ("What does R&D stand for?", "What does R&D mean?"),
    # what the first version of the guards refused (a QA set of 200 paraphrases lost 98 at 0.90)
    ("What does `==` do in Python?", "What does == do in Python?"),
    ("What is **kwargs in Python?", "What is `**kwargs` in Python?"),
    ("Best way to learn C++?", "What's the best way to learn C++"),
    ("How do I use async/await in JavaScript?", "How do I use async and await in JavaScript?"),
    ("What goes well with salt & pepper?", "What goes well with salt and pepper?"),
    ("What is the *best* way to learn Spanish?", "What is the best way to learn Spanish?"),
    ("What is 15 * 4?", "What is 15 times 4?"),
    ("What is 2^10?", "What is 2 to the power of 10?"),
    ("How does the spread operator ... work in JavaScript?", "How does the spread operator (...) work in JavaScript?"),
    ("How do I make fluffy pancakes? 🥞", "How do I make fluffy pancakes?"),
    ("Thanks! 🙏 Can you explain compound interest?", "Thanks! Can you explain compound interest?"),
    ("What is NASA working on?", "What is Nasa working on?"),
    ("Is JavaScript hard to learn?", "Is Javascript hard to learn?"),
    ("How do I reverse a string in python?", "How do I reverse a string in Python?"),
    ("What is the population of australia?", "What is the population of Australia?"),
    ("Quick question: What is a closure?", "Quick question: what is a closure?"),
    ("Let's meet at 3pm.", "Let's meet at 3 pm."),
    ("Why am I so tired at 3 in the afternoon?", "Why am I so tired at 3 pm?"),
    ("Can my kid take adult Tylenol?", "Can my child take grown-up Tylenol?"),
    ("How do I write a story from start to finish?", "How do I write a story from beginning to end?"),
    ("Should I learn Python or JavaScript first?", "Python and JavaScript: which should I learn first?"),
    ("What does ❤️ mean in a text?", "What does ❤ mean in a text?"),  # (a variation selector)
    ("What does 👍 mean?", "What does 👍🏻 mean?"),  # (a skin tone)
    ("How do I learn a new language? 🤔", "How do I learn a new language? 🙂"),  # (a sign-off)
    ("Is 5 greater than 3?", "Is 5 > 3?"),
    ("Is 10 greater than or equal to 5?", "Is 10 >= 5?"),
    ("Should I eat before or after a workout?", "Is it better to eat before or after a workout?"),  # (both choose)
    ("Tea or coffee: which is healthier?", "Which is healthier, tea or coffee?"),
])
def test_symbol_and_case_guards_pass_what_says_nothing(verifier, q, c):
    assert verifier.check(q, c).ok, verifier.check(q, c)
    assert verifier.check(c, q).ok


def test_a_contrast_member_alone_is_no_swap(verifier):
    """A member of a contrast class added or dropped on one side only is not a swap."""
    assert verifier.check("How long does quicksort take?", "How much time does quicksort take?").ok


def test_identical_text_passes_fast_path(verifier):
    assert verifier.check("anything at all", "anything at all").ok


def test_guards_can_be_disabled():
    v = Verifier(guards=frozenset({"number"}))
    assert v.check("How do I enable SSO?", "How do I disable SSO?").ok
    assert not v.check("What is 2+2?", "What is 2+3?").ok


def test_stem_is_consistent():
    assert stem("enable") == stem("enabled") == stem("enabling")
    assert stem("install") == stem("installing")


def test_no_guards_means_none():
    assert Verifier(guards=frozenset()).check("How do I enable SSO?", "How do I disable SSO?").ok


# Found by the third cache QA (0.85 to 0.95): question words are stopwords, so "Where" / "When" was
# invisible; frequency adverbs, "with" / "before", tenses and times of day are common words the
# content guard does not count; irregular comparatives and a few antonyms the lexicon lacked.
@pytest.mark.parametrize("q,c,reason", [
    ("Where was Albert Einstein born?", "When was Albert Einstein born?", "interrogative"),
    ("Who wrote Hamlet?", "When was Hamlet written?", "interrogative"),
    ("Why did the Roman Empire fall?", "What year did the Roman Empire fall?", "interrogative"),
    ("How much does a Tesla cost?", "Why does a Tesla cost so much?", "interrogative"),
    ("Why does my phone always die?", "Why does my phone sometimes die?", "content"),
    ("Does it often snow in London?", "Does it rarely snow in London?", "content"),
    ("Is it okay to take aspirin with alcohol?", "Is it okay to take aspirin before alcohol?", "content"),
    ("Should I drink water during a workout?", "Should I drink water after a workout?", "content"),
    ("What is the past tense of run?", "What is the present tense of run?", "content"),
    ("What is the weather today in Paris?", "What is the weather tomorrow in Paris?", "content"),
    ("Translate to French: good morning", "Translate to French: good night", "content"),
    ("How much water should I drink a day?", "How much water should I drink a week?", "content"),
    ("Is Earth the closest planet to the Sun?", "Is Earth the farthest planet from the Sun?", "antonym"),
    ("Which country has the most people?", "Which country has the fewest people?", "antonym"),
    ("Should I drink more water?", "Should I drink less water?", "antonym"),
    ("Is the number odd?", "Is the number even?", "antonym"),
    ("Who won the World Cup in 2018?", "Who lost the World Cup final in 2018?", "antonym"),
    ("Why is my code failing?", "Why is my code working?", "antonym"),
    ("Explain quantum physics simply.", "Explain quantum physics in detail.", "antonym"),
    ("How many legs does a spider have?", "How many legs does an insect have?", "entity"),
])
def test_third_qa_hard_negatives_are_rejected(verifier, q, c, reason):
    assert verifier.check(q, c) == Verdict(False, reason)
    assert verifier.check(c, q) == Verdict(False, reason)


# The same kind of question asked another way, and a synonym of a contrast member, still pass.
@pytest.mark.parametrize("q,c", [
    ("Why is the sky blue?", "What makes the sky blue?"),
    ("Why is the ocean salty?", "What causes the ocean to be salty?"),
    ("Why do onions make you cry?", "What is the reason onions make you cry?"),
    ("How come cats purr?", "Why do cats purr?"),
    ("When did World War II end?", "What year did World War II end?"),
    ("At what age do babies start talking?", "When do babies start talking?"),
    ("Where was Mozart born?", "In what city was Mozart born?"),
    ("Who painted The Starry Night?", "The Starry Night was painted by whom?"),
    ("How many bones are in the human body?", "What is the number of bones in the human body?"),
    ("Who is the CEO of Apple?", "What is the name of Apple's CEO?"),  # (a kind on one side only)
    ("Why do I feel tired when I wake up?", "What makes me tired after waking up?"),
    ("What does WHO recommend for a fever?", "What does the WHO recommend for fever?"),  # (a name)
    ("How often should I water a cactus?", "How frequently should I water a cactus?"),
    ("Can I take ibuprofen while pregnant?", "Can I take ibuprofen during pregnancy?"),
    ("Why does my phone always die?", "Why does my phone keep dying?"),
    ("Which planet is closest to the Sun?", "What is the nearest planet to the Sun?"),
    ("What is the best way to learn Spanish?", "What's a good way to learn Spanish?"),
    ("Explain quantum physics simply.", "Explain quantum physics in simple terms."),
    ("Is 7 an odd number?", "Is the number 7 odd?"),
    ("How many calories should I eat per day?", "How many calories should I eat daily?"),
])
def test_third_qa_paraphrases_pass(verifier, q, c):
    assert verifier.check(q, c).ok, verifier.check(q, c)
    assert verifier.check(c, q).ok


def test_what_a_question_asks_for(verifier):
    asks = {t: verifier.analyse(t).asks for t in (
        "What makes the sky blue?", "What time does the shop open?", "In which country is Kilimanjaro?",
        "The Mona Lisa was painted by whom?", "How many moons does Mars have?", "What is a closure?",
        "How do I reset my password?", "Which city is Australia's capital?", "WHO guidance on masks",
        "WHERE IS MY ORDER")}
    assert asks == {
        "What makes the sky blue?": {"reason"}, "What time does the shop open?": {"time"},
        "In which country is Kilimanjaro?": {"place"}, "The Mona Lisa was painted by whom?": {"person"},
        "How many moons does Mars have?": {"amount"}, "What is a closure?": set(),
        "How do I reset my password?": set(), "Which city is Australia's capital?": set(),
        "WHO guidance on masks": set(), "WHERE IS MY ORDER": {"place"}}


@pytest.mark.parametrize(("a", "b"), [  # found by the cache QA of 2026-12-04, served at 0.91-0.99
    ("What happens if I take too much vitamin D?", "What happens if I take too little vitamin D?"),
    ("What is the recommended dose of ibuprofen for adults?", "What is the maximum dose of ibuprofen for adults?"),
    ("What is the safe dose of Tylenol per day?", "What is the toxic dose of Tylenol per day?"),
    ('Is this sentence correct: "I seen it"', 'Is this sentence correct: "I saw it"'),
    ("Classify the sentiment of this review: The food was great",
     "Classify the sentiment of this review: The food was terrible"),
    ("What are the tax brackets for this year?", "What are the tax brackets for next year?"),
    ("Summarize the plot of Hamlet in one sentence", "Summarize the plot of Hamlet in one paragraph"),
    ("Explain photosynthesis in simple terms", "Explain photosynthesis in technical terms"),
    ("What is the average salary of a software engineer?", "What is the median salary of a software engineer?"),
    ("How much protein should I eat per day?", "How much protein should I eat per meal?"),
])
def test_a_word_that_matters_swapped_in_the_same_sentence_is_refused(verifier, a, b):
    assert verifier.check(a, b) == Verdict(False, "substitution")
    assert verifier.check(b, a) == Verdict(False, "substitution")


@pytest.mark.parametrize(("a", "b"), [
    ("How do I rename a file in Linux?", "How can I rename a file on Linux?"),  # function words, prepositions
    ("How often should I water a cactus?", "How frequently should I water a cactus?"),  # synonyms
    ("What is the fastest way to learn Spanish?", "What is the quickest way to learn Spanish?"),
    ("What colour is the sky?", "What color is the sky?"),  # British / American
    ("Can I take ibuprofen while pregnant?", "Can I take ibuprofen during pregnancy?"),  # one word's forms
    ("When was the Eiffel Tower built?", "What year was the Eiffel Tower built?"),  # the question's framing
    ("How long does quicksort take?", "How much time does quicksort take?"),
    ("What does R&D stand for?", "What does R&D mean?"),  # a word that matters for a light one
])
def test_a_paraphrase_that_swaps_a_word_in_place_passes(verifier, a, b):
    assert verifier.check(a, b).ok and verifier.check(b, a).ok


@pytest.mark.parametrize(("a", "b"), [  # found by the cache re-check QA of 2026-12-04, served at 0.90-0.999
    ("Is a high fever with a low heart rate dangerous?", "Is a low fever with a high heart rate dangerous?"),
    ("Can a landlord sue a tenant for damages?", "Can a tenant sue a landlord for damages?"),
    ("Can a cheap phone have an expensive camera?", "Can an expensive phone have a cheap camera?"),
    ("What are the rights of an employee during layoffs?", "What are the rights of an employer during layoffs?"),
    ("Arguments for nuclear power", "Arguments against nuclear power"),
    ("How long until Christmas?", "How long since Christmas?"),
])
def test_words_that_trade_places_or_look_alike_are_refused(verifier, a, b):
    assert not verifier.check(a, b).ok and not verifier.check(b, a).ok


@pytest.mark.parametrize(("a", "b"), [
    ("Does Google own YouTube?", "Is YouTube owned by Google?"),  # a passive turns them round itself
    ("Where is the city centre in Leeds?", "Where is the city center in Leeds?"),
    ("How do I organise my closet?", "How do I organize my closet?"),
    ("What is the best aluminium pan?", "What is the best aluminum pan?"),
    ("How do I write a good catalogue description?", "How do I write a good catalog description?"),
    ("What are some easy dinner ideas?", "What are some simple dinner ideas?"),
    ("What are fun activities for kids?", "What are fun activities for children?"),
])
def test_spellings_and_synonyms_swapped_in_place_pass(verifier, a, b):
    assert verifier.check(a, b).ok and verifier.check(b, a).ok


@pytest.mark.parametrize("q,c,reason", [
    # modals: permission, advice, obligation (a cache QA's new hard negatives, 0.94-0.98)
    ("Can I eat sushi while pregnant?", "Should I eat sushi while pregnant?", "logic"),
    ("Do I have to file taxes as a student?", "Can I file taxes as a student?", "logic"),
    ("Should I tell my boss I am quitting?", "Must I tell my boss I am quitting?", "logic"),
    ("What can I eat while pregnant?", "What should I eat while pregnant?", "logic"),
    # conditionals, scope, quantifiers
    ("Is the deposit refundable if I cancel?", "Is the deposit refundable unless I cancel?", "logic"),
    ("Does the plan only cover dental?", "Does the plan also cover dental?", "logic"),
    ("Can I only pay by card?", "Can I pay by card?", "logic"),
    ("Do both partners need to sign the lease?", "Does either partner need to sign the lease?", "logic"),
    # one of a thing against many of it (a blind held-out set, heldout11: served at 0.91 and 0.94)
    ("How do I add an item to a list in Python?", "How do I add multiple items to a list in Python?", "logic"),
    ("Name a prime number between 10 and 20", "Name all the prime numbers between 10 and 20", "logic"),
    ("Give me an example of a mammal", "Give me several examples of mammals", "logic"),
    # order and time
    ("List US presidents in chronological order.", "List US presidents in reverse chronological order.", "logic"),
    ("What is the date two weeks from today?", "What is the date two weeks before today?", "logic"),
    # subject or object of the verb
    ("Who taught Plato?", "Who did Plato teach?", "role"),
    ("Whom did Napoleon defeat at Austerlitz?", "Who defeated Napoleon at Austerlitz?", "role"),
    ("What did the virus infect?", "What infected the virus?", "role"),
    # two runs of words trading places, as two words do (a held-out pair)
    ("Did Thomas Edison ever work for Nikola Tesla?", "Did Nikola Tesla ever work for Thomas Edison?", "substitution"),
    # code: indentation, the case of a format code, a quoted literal, nested brackets
    ("What does this Python code print?\nfor i in range(3):\n    x = i\nprint(x)",
     "What does this Python code print?\nfor i in range(3):\n    x = i\n    print(x)", "layout"),
    ("Is this YAML a list or a map?\nitems:\n  - a\n  - b", "Is this YAML a list or a map?\nitems:\n- a\n- b", "layout"),
    ("What does the %Y format code mean in strftime?", "What does the %y format code mean in strftime?", "layout"),
    ("What is the length of the string 'hello'?", "What is the length of the string 'hello world'?", "layout"),
    ("What is the output of len([[]])?", "What is the output of len([])?", "layout"),
    # a "how" or "where" question that asks no way for the asker: its modals, when both have one (a
    # QA's pairs asked with their clause first were refused, the same questions asked plainly passed)
    ("How many hours can I work on a student visa?", "How many hours must I work on a student visa?", "logic"),
    ("How fast can I drive on the motorway?", "How fast should I drive on the motorway?", "logic"),
    ("How can a pawn move in chess?", "How should a pawn move in chess?", "logic"),
    ("Where can I drive with a learner's permit?", "Where should I drive with a learner's permit?", "logic"),
    # what was against what is (a blind held-out set's false hits, heldout13)
    ("Is Pluto a planet?", "Was Pluto a planet?", "logic"),
    ("Does Twitter have a 140 character limit?", "Did Twitter have a 140 character limit?", "logic"),
    ("Has the housing market crashed?", "Will the housing market crash?", "logic"),
    ("Who is the oldest person in the world?", "Who was the oldest person in the world ever?", "logic"),
    # (a re-check QA's: a question of a wh-word and "is" about what changes)
    ("Who's the CEO of Twitter?", "Who was the CEO of Twitter?", "logic"),
    ("What's the population of Tokyo?", "What was the population of Tokyo?", "logic"),
])
def test_logic_role_and_layout_hard_negatives_are_rejected(verifier, q, c, reason):
    """Found by a cache QA: 53 of 212 new hard negatives served at 0.90, the small words that decide
    what a question asks (or code's layout) being all that differed (cache/logic.py)."""
    assert verifier.check(q, c) == Verdict(False, reason)
    assert verifier.check(c, q) == Verdict(False, reason)


@pytest.mark.parametrize("q,c", [
    ("How can I reset my password?", "How should I reset my password?"),  # a way, whatever the modal
    ("Where can I find my invoice?", "Where do I find my invoices?"),
    ("Can you explain what machine learning is?", "What is machine learning?"),  # a favour asked
    ("Could you explain compound interest?", "Can you explain compound interest?"),
    ("Is it okay to take aspirin with alcohol?", "Can I take aspirin with alcohol?"),
    ("Am I able to drive with an expired license?", "Can I drive with an expired license?"),
    ("May I bring my dog?", "Can I bring my dog?"),
    ("Do I need to renew my visa?", "Do I have to renew my visa?"),
    ("What should I pack for a beach vacation?", "What do I need to pack for a beach holiday?"),
    ("Are all swans white?", "Is every swan white?"),
    ("What's the difference between 'affect' and 'effect'?", "What is the difference between 'affect' and 'effect'?"),
    ("What does the regex ^a.*b$ match?", "Which strings does the regex ^a.*b$ match?"),
    ("Who is the CEO of Apple?", "Who's Apple's CEO?"),
    # "a" before another noun than the quantified one is no count of it
    ("Give me a list of all the planets", "List all the planets"),
    ("How do I select multiple rows in Excel?", "How do I select several rows in Excel?"),
    # an amount or a place asked with a modal on one side only
    ("How long should I boil an egg?", "How long do I boil an egg?"),
    ("How many hours should a teenager sleep each night?", "How many hours does a teenager need to sleep each night?"),
    ("Where can I find the hosts file on Windows?", "Where is the hosts file on Windows?"),
    # a way for a person, not only the asker (a review's finds)
    ("How can beginners learn to code?", "How should beginners learn to code?"),
    ("How can my child improve his reading?", "How should my child improve his reading?"),
    ("Where can I find the config file?", "Where might I find the config file?"),
    # the same tense however written
    ("Has anyone climbed Everest without oxygen?", "Did anyone climb Everest without oxygen?"),
    ("Have you got a recipe for pancakes?", "Do you have a recipe for pancakes?"),
    ("Will it hurt to get a tattoo?", "Does it hurt to get a tattoo?"),
    ("How can I tell if someone has hacked my email?", "How do I tell if my email is hacked?"),
    # (a re-check QA's: a clause's tense, a question about what stays, a why-question)
    ("My flight was cancelled, am I entitled to compensation?", "My flight got cancelled, am I entitled to compensation?"),
    ("Who was Albert Einstein?", "Who is Albert Einstein?"),
    ("Who was the author of Pride and Prejudice?", "Who is the author of Pride and Prejudice?"),
    ("Why does my build fail?", "Why did my build fail?"),
    ("Sort my emails from oldest to newest", "Sort my emails from oldest to most recent"),
])
def test_paraphrases_keep_their_logic_words(verifier, q, c):
    assert verifier.check(q, c).ok, verifier.check(q, c)
    assert verifier.check(c, q).ok


@pytest.mark.parametrize("q,c,reason", [
    # a re-check QA's pairs written to get around the first version (qa7)
    ("Is it safe to microwave food in plastic containers?", "Is it possible to microwave food in plastic containers?",
     "logic"),
    ("Does every employee get a bonus?", "Do some employees get a bonus?", "logic"),
    ("Does the plan cover just dental?", "Does the plan cover dental too?", "logic"),
    ("Who was Aristotle taught by?", "Who was taught by Aristotle?", "role"),
    ("Is Anna Tom's sister?", "Is Tom Anna's sister?", "role"),
    ("Which team beat Brazil in 2014?", "Which team did Brazil beat in 2014?", "role"),
    ("Is x = True valid Python?", "Is x = true valid Python?", "layout"),
    ("What does Math.max return?", "What does math.max return?", "layout"),
    ("What does print(name) output?", "What does print('name') output?", "layout"),
    ("Will I lose weight if I sleep more?", "Will I sleep more if I lose weight?", "role"),
    ("Which company bought Instagram?", "Which company was bought by Instagram?", "role"),
    ("Will my card work abroad as long as I notify the bank?", "Will my card work abroad in case I notify the bank?",
     "logic"),
    ("Print the array from left to right.", "Print the array from right to left.", "logic"),
    ("Sort the names A to Z.", "Sort the names Z to A.", "logic"),
    ("Are most dogs friendly?", "Are a lot of dogs friendly?", "logic"),
    ("Does the law let me record calls at work?", "Does the law force me to record calls at work?", "logic"),
    ("Could I have avoided the overdraft fee?", "Can I avoid the overdraft fee?", "logic"),
])
def test_rechecked_hard_negatives_are_rejected(verifier, q, c, reason):
    assert verifier.check(q, c) == Verdict(False, reason)
    assert verifier.check(c, q) == Verdict(False, reason)


@pytest.mark.parametrize("q,c", [
    ("Is it OK to take aspirin with alcohol?", "Is it okay to take aspirin with alcohol?"),  # OK is no name
    ("Will it hurt to get a tattoo?", "Does it hurt to get a tattoo?"),
    ("Would you mind explaining recursion?", "Can you explain recursion?"),
    ("Is it a good idea to take melatonin every night?", "Should I take melatonin every night?"),
    ("Does the plan also cover dental?", "Does the plan cover dental as well?"),
    ("Is the offer only for new customers?", "Is the offer just for new customers?"),
    ("When should I replace my toothbrush?", "When do I need to replace my toothbrush?"),
    ("Did Alice hire Bob?", "Was Bob hired by Alice?"),
    ("What is the capital of Australia?", "Which city is Australia's capital?"),
    ("What does this code print?\nfor i in range(3):\n\tprint(i)", "What will this code print?\nfor i in range(3):\n    print(i)"),
])
def test_rechecked_paraphrases_pass(verifier, q, c):
    assert verifier.check(q, c).ok, verifier.check(q, c)
    assert verifier.check(c, q).ok


@pytest.mark.parametrize(("a", "b"), [  # a cache QA's false hits at the default threshold (0.90-0.95)
    ("Is the water boiling?", "Is the water almost boiling?"),
    ("Is my code correct?", "Is my code mostly correct?"),
    ("Is Pluto a planet?", "Is Pluto a dwarf planet?"),
    ("Is Sydney a city?", "Is Sydney a capital city?"),
    ("Do I need a passport for Mexico?", "Do I need a passport for Mexico by land?"),
    ("Can I give my dog ibuprofen?", "Can I give my dog a small dose of ibuprofen?"),
    ("Is this mushroom edible?", "Is this mushroom edible raw?"),
])
def test_a_qualifier_added_to_the_same_question_is_refused(verifier, a, b):
    assert verifier.check(a, b) == Verdict(False, "qualifier")
    assert verifier.check(b, a) == Verdict(False, "qualifier")


@pytest.mark.parametrize(("a", "b"), [
    ("How do I reset my password?", "Can you tell me how to reset my password?"),  # a framing before it
    ("How do I reset my password?", "How do I reset my password, please?"),  # a light word
    ("What is the capital of France?", "What is the capital city of France?"),  # before a function word
    ("Write SQL to find duplicate emails.", "Write a SQL query to find duplicate emails."),
    ("How many days until Christmas?", "How many days are left until Christmas?"),
])
def test_words_that_frame_or_name_what_was_there_are_not_a_qualifier(verifier, a, b):
    assert verifier.check(a, b).ok and verifier.check(b, a).ok


@pytest.mark.parametrize(("a", "b"), [
    ("How many bits in a byte?", "How many bytes in a bit?"),
    ("How many bits in a nibble?", "How many nibbles in a bit?"),
])
def test_unit_words_without_a_number_swapped_around_in_are_refused(verifier, a, b):
    """Found by QA: "bit" is also a stopword ("a bit"), so "bits in a byte" was read as no relation."""
    assert verifier.check(a, b) == Verdict(False, "relation")


@pytest.mark.parametrize(("a", "b"), [
    # a word that matters added at the end reads as a qualifier ("edible raw", "Mexico by land"): the
    # guard's price, paraphrases that name what was there at the end (QA's, before the guard)
    ("What is the space complexity of quicksort?", "What is the space complexity of the quicksort algorithm?"),
    ("Why does my laptop get so hot?", "Why does my laptop get so hot all the time?"),
])
def test_a_head_noun_added_at_the_end_is_refused_as_a_qualifier(verifier, a, b):
    assert verifier.check(a, b) == Verdict(False, "qualifier")


@pytest.mark.parametrize(("a", "b"), [  # a re-check QA's false hits of the guard's first version
    ("Are mushrooms poisonous?", "Are all mushrooms poisonous?"),  # a quantity word, though a stopword
    ("Can I give my cat milk?", "Can I give my cat a little milk?"),
    ("Can I take ibuprofen with alcohol?", "Can I take ibuprofen daily with alcohol?"),  # an adverb before "with"
    ("Do I need a visa for Japan?", "Do I still need a visa for Japan?"),  # before an auxiliary
])
def test_quantities_and_adverbs_added_anywhere_are_qualifiers(verifier, a, b):
    assert verifier.check(a, b) == Verdict(False, "qualifier")
    assert verifier.check(b, a) == Verdict(False, "qualifier")


@pytest.mark.parametrize(("a", "b"), [  # a cache QA's false hits (0.90-0.93): a phrase or a noun added
    ("What is the GDP of China?", "What is the GDP per capita of China?"),  # inside the question
    ("What is the GDP of Brazil?", "What is the GDP growth of Brazil?"),
    ("What is the life expectancy in Japan?", "What is the life expectancy of men in Japan?"),
    ("What is the life expectancy in Japan?", "What is the life expectancy of women in Japan?"),
    ("Write an essay on climate change", "Write an outline of an essay on climate change"),
])
def test_a_phrase_or_another_noun_added_inside_the_question_is_a_qualifier(verifier, a, b):
    """A prepositional phrase added mid-question narrows it; a noun added before a linking word names
    another thing ("GDP growth"), unless it is a generic head that names what was there ("a SQL
    query", "days left until": above)."""
    assert verifier.check(a, b) == Verdict(False, "qualifier")
    assert verifier.check(b, a) == Verdict(False, "qualifier")


@pytest.mark.parametrize(("a", "b"), [  # a re-check QA's false hits of those rules' first version
    ("What is the color of a resistor?", "What is the color code of a resistor?"),  # a generic head
    ("What is the cost of linear regression?", "What is the cost function of linear regression?"),  # before
    ("How many seats are on the flight?", "How many seats are left on the flight?"),  # a word it does not
    ("How many days are in the year?", "How many days are left in the year?"),  # go with
    ("What is the life expectancy in Japan?", "For women, what is the life expectancy in Japan?"),  # put first
])
def test_a_generic_head_counts_only_before_its_own_words_and_a_fronted_phrase_narrows(verifier, a, b):
    assert verifier.check(a, b) == Verdict(False, "qualifier")
    assert verifier.check(b, a) == Verdict(False, "qualifier")


@pytest.mark.parametrize(("a", "b"), [  # a third re-check's false hits (0.91-0.94)
    ("Software engineer salary in Berlin", "Senior software engineer salary in Berlin"),  # before keywords
    ("Beer calories per bottle", "Non-alcoholic beer calories per bottle"),
    ("How much does a ticket to the Louvre cost?", "How much does a ticket to the Louvre cost in total for a family?"),
    ("How long should I boil pasta?", "How long should I boil pasta if it is fresh and homemade?"),  # 5+ words
    ("Explain how a car engine works.", "Explain how an electric car engine works."),  # "a" / "an"
])
def test_many_words_added_a_word_before_keywords_and_an_article_changed_are_read(verifier, a, b):
    assert verifier.check(a, b) == Verdict(False, "qualifier")
    assert verifier.check(b, a) == Verdict(False, "qualifier")


@pytest.mark.parametrize(("a", "b"), [
    ("Explain recursion to me.", "Briefly, explain recursion to me."),  # an adverb before an instruction
    ("How do I reset my password?", "Can you tell me how I reset my password?"),  # framing
])
def test_framing_before_a_question_or_an_instruction_passes(verifier, a, b):
    assert verifier.check(a, b).ok and verifier.check(b, a).ok


@pytest.mark.parametrize(("a", "b"), [  # the same re-check's paraphrases refused by that first version
    ("How do I convert a string to an integer in Java?", "How do I convert a string value to an integer in Java?"),
    ("How long does it take on average to boil an egg?", "How long does it take to boil an egg?"),
    ("What is the chemical symbol of gold?", "What is the chemical symbol, in short, of gold?"),
    ("What is a prime number?", "What is, by definition, a prime number?"),
    ("How many bones are in the human body?", "How many bones are there in the human body in total?"),
])
def test_neutral_phrases_and_generic_heads_before_their_words_are_no_qualifier(verifier, a, b):
    assert verifier.check(a, b).ok and verifier.check(b, a).ok



@pytest.mark.parametrize(("a", "b"), [
    ("Is Pluto a planet?", "Why is Pluto a planet?"),
    ("Did the Roman Empire fall?", "When did the Roman Empire fall?"),
])
def test_a_question_word_put_before_a_yes_no_question_is_a_qualifier(verifier, a, b):
    assert verifier.check(a, b) == Verdict(False, "qualifier")


@pytest.mark.parametrize(("a", "b"), [  # a re-check QA's paraphrases that the first version refused
    ("Who is the CEO of Tesla?", "Who is the current CEO of Tesla?"),
    ("What are the symptoms of the flu?", "What are the main symptoms of the flu?"),
    ("How do I delete my Instagram account?", "How do I delete my Instagram account permanently?"),
    ("What does FOMO mean?", "What does the acronym FOMO mean?"),
    ("How do I take a screenshot on Windows?", "How do I take a screenshot on Windows on my laptop?"),
    ("What is a neural network?", "What is a neural network in simple terms?"),
])
def test_modifiers_that_restrict_nothing_and_the_users_setting_pass(verifier, a, b):
    assert verifier.check(a, b).ok and verifier.check(b, a).ok


@pytest.mark.parametrize("b", ["What's the square root of 144? Thanks!", "What's the square root of 144? Thank you.",
                               "What's the square root of 144? Please answer."])
def test_a_polite_second_sentence_is_no_name(verifier, b):
    """Found by a held-out set: a later sentence's capitalised first word was read as a name."""
    assert verifier.check("What's the square root of 144?", b).ok
    assert verifier.check("Who wrote Hamlet?", "Who wrote Hamlet? Shakespeare?").reason == "entity"


def test_the_qualifier_guard_can_be_turned_off():
    """``PAGEGATE_CACHE_QUALIFIER_GUARD=false``: the cache's verifier runs every guard but that one."""
    from redis.asyncio import Redis

    from cache import build_cache
    from gateway.settings import Settings

    pair = ("Is Pluto a planet?", "Is Pluto a dwarf planet?")
    for on in (True, False):  # (the client never connects here)
        cache = build_cache(Settings(cache_qualifier_guard=on, load_engine=False),
                            redis=Redis.from_url("redis://127.0.0.1:6379/15"))
        try:
            assert cache.verifier.check(*pair).ok is not on
            assert cache.verifier.check("How many bits in a byte?", "How many bytes in a bit?").reason == "relation"
        finally:
            cache.embedder.close()


async def test_a_candidate_whose_stored_answer_is_not_json_is_skipped_by_the_query_engine_index():
    """Found by a review: in Redis Stack mode ``FT.SEARCH`` replies were parsed whole, so one entry
    that was not JSON failed every lookup that found it (a bypass for the entry's whole TTL)."""
    import numpy as np

    from cache.ft_index import QueryEngineIndex

    class FakeRedis:
        async def execute_command(self, *args):
            if args[0] == "FT.INFO":
                return []
            return [2, b"pg:cache:{t}:e:bad", [b"d", b"0.01", b"text", b"q", b"resp", b"not json {"],
                    b"pg:cache:{t}:e:good", [b"d", b"0.02", b"text", b"q", b"resp", b'{"choices": []}']]

    found = await QueryEngineIndex(FakeRedis(), "pg:", 4).search("ns", np.ones(4, np.float32), 4, 0.5)
    assert [(c.entry_id, c.response) for c in found] == [("bad", None), ("good", {"choices": []})]


@pytest.mark.parametrize(("a", "b"), [  # a cache QA's find, then a blind held-out set's (heldout9)
    ("What is my IP address?", "What is your IP address?"),
    ("What time zone are you in?", "What time zone am I in?"),
    ("Can you see my earlier messages in this chat?", "Can I see my earlier messages in this chat?"),
    ("Can you call me by a nickname?", "Can I call you by a nickname?"),
    ("Can you summarize your last answer?", "Can you summarize my last message?"),
    ("Can I claim my mother as a dependent on my taxes?", "Can my mother claim me as a dependent on her taxes?"),
    # a favour asked against the same done for the listener (a review's finds, 0.97-0.98)
    ("Will you teach me how to cook?", "Will I teach you how to cook?"),
    ("Would you help me move this weekend?", "Would I help you move this weekend?"),
    ("Tell me what you think about remote work.", "What do I think about remote work?"),
    ("Please explain to me how taxes work.", "Please explain to you how taxes work."),
    # roles inside a clause (heldout9, served before the clause rule)
    ("Should I tip my hairdresser if she owns the salon?", "Should I tip my hairdresser if I own the salon?"),
    ("What should I say when my manager gives me negative feedback?",
     "What should I say when I give my manager negative feedback?"),
    ("I owe my friend money and can't pay it back, what should I do?",
     "My friend owes me money and can't pay it back, what should I do?"),
    ("Do I need a consent letter if my child travels abroad without me?",
     "Do I need a consent letter if I travel abroad without my child?"),
    # a thing that is the speaker's on one side and another's on the other (heldout10)
    ("My classmate copied my homework. Should I tell the teacher?",
     "I copied my classmate's homework. Should I tell the teacher?"),
    ("My dog bit the neighbor's kid. Who is liable?", "The neighbor's dog bit my kid. Who is liable?"),
    ("Can my ex garnish my wages for unpaid child support?", "Can I garnish my ex's wages for unpaid child support?"),
    # the same doing turned round: a relative clause, a passive against an active, a clause with no pronoun
    ("How do I get over someone who rejected me?", "How do I get over someone I rejected?"),
    ("How do I unblock someone who blocked me?", "How do I unblock someone I blocked?"),
    ("My son was bullied by a classmate. Should I contact the school?",
     "My son bullied a classmate. Should I contact the school?"),
    ("Can I press charges if my neighbor threatened me?", "Can my neighbor press charges if I threatened him?"),
])
def test_another_person_in_the_same_question_is_refused(verifier, a, b):
    assert verifier.check(a, b) == Verdict(False, "person")
    assert verifier.check(b, a) == Verdict(False, "person")


@pytest.mark.parametrize(("a", "b"), [
    ("How do I reset my router?", "How do you reset your router?"),  # the generic "you"
    ("What should I do if I lose my passport abroad?", "What do you do if you lose your passport abroad?"),
    ("How do I back up my photos?", "What's the best way to back up your photos?"),
    ("How do we stop our kids from fighting?", "How can I get my children to stop fighting?"),
    ("How do I reset my password?", "Can you tell me how to reset my password?"),  # a favour's framing
    ("How do I tie a tie?", "Tell me how to tie a tie."),
    ("Can you help me write a cover letter?", "Would you help me with writing my cover letter?"),
    ("How do you politely decline a meeting invite?", "What's a polite way for me to decline a meeting invite?"),
    ("What happens if I miss a credit card payment?", "What happens if you miss a credit card payment?"),
    ("Can I take ibuprofen if I have a cold?", "Can you take ibuprofen if you have a cold?"),
    ("My neighbor's tree fell on my fence. Who pays for the repair?",
     "A tree from my neighbor's yard fell on my fence. Who pays for the repair?"),
    ("What's my friend's birthday gift budget?", "What is the budget for my friend's birthday gift?"),
    ("My landlord kept my security deposit. How do I get it back?",
     "My security deposit was kept by my landlord. How do I get it back?"),  # a passive, the same doer
    ("If I miss a credit card payment, what happens?", "What happens if I miss a credit card payment?"),
])
def test_a_question_reworded_between_persons_passes(verifier, a, b):
    assert verifier.check(a, b).reason != "person" and verifier.check(b, a).reason != "person"


def test_getting_rid_of_and_keeping_from_are_negations_and_one_after_an_auxiliary_is_no_number(verifier):
    """A blind held-out set's paraphrases refused as a negation or a number."""
    assert verifier.check("How do I get rid of hiccups?", "How can I stop hiccups?").ok
    assert verifier.check("How do I get rid of hiccups?", "How do I get hiccups?").reason == "negation"
    assert verifier.check("How do I stop my glasses from fogging up?", "How can I keep my glasses from fogging?").ok
    assert verifier.check("How can I keep my glasses from fogging?", "How can I make my glasses fog?").reason == "negation"
    assert verifier.check("How do I keep my phone charged?", "How do I stop my phone charging?").reason == "negation"
    assert verifier.check("How do I clear my browser cache?", "How does one clear their browser cache?").ok
    assert verifier.check("Does one cup of coffee help?", "Do two cups of coffee help?").reason == "number"
