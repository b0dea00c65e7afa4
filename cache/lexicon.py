"""Word lists for the hard-negative verifier. General English knowledge (function words,
antonyms, number words, units, task verbs, common entity classes), not tuned to any test set."""

from __future__ import annotations

STOPWORDS = frozenset("""
a an the this that these those there here it its it's i me my mine we us our you your yours he him his
she her they them their what which who whom whose when where why how is are was were be been being am
do does did doing done have has had having will would shall should can could may might must
to of for from by at as into onto upon about with within via per than then so such very just also too
and or but if because while until since though although either both each every any some all
please pls kindly tell give show help want need like know let get got make made way ways thing things
one's oneself really actually basically simply quite rather bit little lot lots
hi hello hey thanks thank ok okay yes
""".split())

# Filler that paraphrases add or drop without changing the question.
FILLER = frozenset("""
explain describe detail details define definition mean meaning question questions answer steps step
procedure process method approach guide instructions instruction tutorial example examples best good
possible correct proper properly right exactly quickly easy easily simple simply briefly overview
anyone someone somebody something able anybody go going try trying write writing say saying
""".split())

# Negation words of the most used languages written in the Latin script. The cache reads English
# only (cache/language.py), so the verifier meets them in English that quotes another language:
# "Translate to English: Ich bin müde." / "… Ich bin nicht müde.". Left out as English words: French
# "personne" and "sans", Spanish "sin", Portuguese "sem", Polish "nic" (a NIC); and Vietnamese
# "không", which also ends a yes/no question. French elisions ("n'est", "n'ai") are read by their
# "n'" (verifier).
NEGATIONS_ABROAD = frozenset(w for line in """
    de: nicht kein keine keinen keinem keiner keines nie niemals nichts niemand ohne
    fr: ne pas jamais rien aucun aucune nullement
    es: nunca nada nadie ningún ninguno ninguna jamás tampoco
    it: non mai niente nulla nessuno nessuna senza
    pt: não nenhum nenhuma ninguém
    nl: niet geen nooit niets niemand zonder
    sv da no: inte icke ej ingen inget inga aldrig ikke aldri utan uden
    pl cs: nie nigdy nikt żaden nikdy
    tr: değil hiç yok
    id ms: tidak bukan jangan
    """.splitlines() for w in line.partition(":")[2].split())
NEGATIONS = frozenset("""
not no never none nothing nobody nowhere neither nor cannot without isn't aren't wasn't weren't
don't doesn't didn't won't wouldn't can't couldn't shouldn't mustn't hasn't haven't hadn't
isnt arent wasnt werent dont doesnt didnt wont wouldnt cant couldnt shouldnt mustnt hasnt havent hadnt
""".split()) | NEGATIONS_ABROAD

# English function words that mark a text as English (cache/language.py): none is a common word of
# another language written in the Latin script, so not "is", "in", "to", "a", "do", "was", "will",
# "are", "can", "for", "have" (Dutch, German, Slavic, Romanian, Danish … words too).
FUNCTION_WORDS = frozenset("""
the this that these those there here what which who whom whose when where why how
you your yours she him his they them their its it our ours us
does did doing done has had having been being were would should could shall might must
with from into onto about above across after against among around before behind below beneath
between beyond during through toward towards until upon within without than then
and but because although though while whether either neither nor if or up
not never nothing nobody none cannot some any every each both all many much
""".split())

ANTONYM_PAIRS = [
    ("enable", "disable"), ("activate", "deactivate"), ("add", "remove"), ("add", "delete"),
    ("create", "delete"), ("create", "destroy"), ("insert", "delete"), ("install", "uninstall"),
    ("install", "remove"), ("increase", "decrease"), ("increase", "reduce"), ("raise", "lower"),
    ("start", "stop"), ("begin", "end"), ("open", "close"), ("on", "off"), ("up", "down"),
    ("before", "after"), ("above", "below"), ("over", "under"), ("min", "max"), ("for", "against"),
    ("until", "since"),
    ("minimum", "maximum"), ("more", "less"), ("more", "fewer"), ("most", "least"), ("high", "low"),
    ("higher", "lower"), ("highest", "lowest"), ("best", "worst"), ("better", "worse"),
    ("first", "last"), ("encrypt", "decrypt"), ("encode", "decode"), ("compress", "decompress"),
    ("zip", "unzip"), ("upload", "download"), ("import", "export"), ("buy", "sell"),
    ("true", "false"), ("allow", "deny"), ("allow", "block"), ("accept", "reject"),
    ("include", "exclude"), ("lock", "unlock"), ("show", "hide"), ("push", "pull"),
    ("send", "receive"), ("connect", "disconnect"), ("login", "logout"), ("log in", "log out"),
    ("subscribe", "unsubscribe"), ("follow", "unfollow"), ("win", "lose"), ("hot", "cold"),
    ("fast", "slow"), ("cheap", "expensive"), ("positive", "negative"), ("left", "right"),
    ("north", "south"), ("east", "west"), ("ascending", "descending"), ("asc", "desc"),
    ("mount", "unmount"), ("freeze", "unfreeze"), ("merge", "split"), ("input", "output"),
    ("read", "write"), ("public", "private"), ("internal", "external"), ("inside", "outside"),
    ("always", "never"), ("with", "without"), ("pros", "cons"), ("advantage", "disadvantage"),
    ("benefit", "drawback"), ("safe", "dangerous"), ("safe", "unsafe"), ("legal", "illegal"),
    ("valid", "invalid"), ("success", "failure"), ("succeed", "fail"), ("pass", "fail"),
    ("import", "export"), ("expand", "collapse"), ("attach", "detach"), ("block", "unblock"),
    ("mute", "unmute"), ("pause", "resume"), ("archive", "unarchive"), ("pin", "unpin"),
    ("hide", "unhide"), ("approve", "reject"), ("grant", "revoke"), ("gain", "lose"),
    ("sync", "unsync"), ("link", "unlink"), ("encrypted", "unencrypted"), ("serialize", "deserialize"),
    ("uppercase", "lowercase"), ("upper", "lower"), ("maximize", "minimize"), ("max", "min"),
    ("earliest", "latest"), ("oldest", "newest"), ("old", "new"), ("young", "old"), ("big", "small"),
    ("large", "small"), ("long", "short"), ("wide", "narrow"), ("heavy", "light"), ("dark", "light"),
    ("light", "heavy"), ("rich", "poor"), ("strong", "weak"), ("easy", "hard"), ("easy", "difficult"),
    ("love", "hate"), ("like", "dislike"), ("agree", "disagree"), ("arrive", "depart"),
    ("import", "export"), ("borrow", "lend"), ("lend", "borrow"), ("give", "take"), ("buy", "rent"),
    ("ban", "unban"), ("signup", "signin"), ("sign up", "sign in"), ("join", "leave"),
    ("morning", "evening"), ("day", "night"), ("summer", "winter"), ("spring", "autumn"),
    ("male", "female"), ("men", "women"), ("man", "woman"), ("boy", "girl"), ("plus", "minus"),
    ("add", "subtract"), ("multiply", "divide"), ("sum", "difference"), ("profit", "loss"),
    ("import", "export"), ("client", "server"), ("frontend", "backend"), ("source", "target"),
    ("horizontal", "vertical"), ("row", "column"), ("rows", "columns"), ("width", "height"),
    ("top", "bottom"), ("front", "back"), ("inbound", "outbound"), ("incoming", "outgoing"),
    ("good", "bad"), ("healthy", "unhealthy"), ("right", "wrong"), ("happy", "sad"), ("clean", "dirty"),
    ("full", "empty"), ("early", "late"), ("cheapest", "most expensive"), ("near", "far"),
    ("increase", "lower"), ("rise", "fall"), ("gain", "loss"), ("import", "export"), ("wet", "dry"),
    ("thick", "thin"), ("soft", "hard"), ("loud", "quiet"), ("hard", "easy"), ("true", "untrue"),
    ("benefit", "risk"), ("pro", "con"), ("legal", "banned"), ("like", "hate"), ("keep", "discard"),
    ("start", "end"), ("start", "finish"), ("begin", "finish"), ("rise", "set"), ("@am", "@pm"), ("child", "adult"), ("children", "adults"),
    ("kid", "adult"), ("baby", "adult"), ("cooked", "raw"), ("and", "or"),
    ("odd", "even"), ("won", "lost"), ("winner", "loser"), ("work", "fail"), ("work", "broken"),
    ("close", "far"), ("many", "few"), ("simple", "detailed"), ("simple", "complex"),
    ("simply", "detail"), ("briefly", "detail"), ("brief", "detailed"), ("briefly", "depth"),
]
# Adjectives whose -er/-est forms are comparatives ("faster", "biggest"): the antonym guard reduces
# those forms to these (and only these, so "offer" or "water" are never read as "off" or "wat").
GRADABLE = frozenset("""big small large fast slow easy hard high low long short old new young wide
    narrow heavy light dark rich poor strong weak hot cold cheap thick thin soft loud quiet near
    full empty wet dry safe healthy early late clean dirty happy sad close simple""".split())

# Comparatives and superlatives not made with -er/-est, read as their base in the same way:
# "closest" / "farthest" is close / far, "most" / "fewest" many / few. ("less" and "least" belong
# to "little", but more / less and more / fewer are one opposition: both read as many / few.)
IRREGULAR_COMPARATIVES = {
    "better": "good", "best": "good", "worse": "bad", "worst": "bad", "farther": "far",
    "farthest": "far", "further": "far", "furthest": "far", "more": "many", "most": "many",
    "fewer": "few", "fewest": "few", "less": "few", "least": "few",
}

# Words that give the things around them a direction: "convert A to B", "from A to B",
# "A bigger than B", "A north of B", "A before B" (cache/relations.py).
DIRECTION_TO = frozenset("to into onto toward towards".split())
ORDER_PREPOSITIONS = frozenset("before after above below beneath underneath behind".split())
POSITIONS = frozenset("""north south east west northeast northwest southeast southwest left right
    ahead front top""".split())  # "<word> of"
# Words that relate two names without ordering them: "Python and Java", "Python vs Java".
SYMMETRIC = frozenset("and or nor vs versus with between plus & compared compare".split())
CLAUSE_BREAKS = frozenset(". ? ! ; : , or but".split())

# Verbs that negate what follows: "foods to avoid" asks the opposite of "foods to eat".
NEGATING_VERBS = frozenset("""avoid avoiding avoided prevent preventing stop stopping refrain skip rid
    forbid forbidden prohibit prohibited ban banned""".split())

# Prefixes that flip meaning: "install" vs "uninstall", "able" vs "unable".
NEGATING_PREFIXES = ("un", "dis", "de", "non", "in", "im", "ir", "il", "anti", "mis")

NUMBER_WORDS = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
    "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15,
    "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19, "twenty": 20, "thirty": 30,
    "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90,
    "hundred": 100, "thousand": 1000, "million": 10**6, "billion": 10**9, "dozen": 12,
    "half": 0.5, "quarter": 0.25, "twice": 2, "double": 2, "triple": 3, "once": 1,
}
ORDINALS = {
    "first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5, "sixth": 6, "seventh": 7,
    "eighth": 8, "ninth": 9, "tenth": 10, "eleventh": 11, "twelfth": 12, "twentieth": 20,
    "hundredth": 100, "last": -1,
}
MONTHS = ("january february march april may june july august september october november december"
          ).split()
MONTH_ABBR = {m[:3]: m for m in MONTHS} | {"sept": "september"}
WEEKDAYS = "monday tuesday wednesday thursday friday saturday sunday".split()

UNITS = {
    "km": "kilometer kilometers kilometre kilometres km kms".split(),
    "mile": "mile miles mi".split(),
    "m": "meter meters metre metres m".split(),
    "cm": "centimeter centimeters centimetre centimetres cm".split(),
    "mm": "millimeter millimeters millimetre millimetres mm".split(),
    "ft": "foot feet ft".split(),
    "inch": "inch inches".split(),
    "yard": "yard yards yd".split(),
    "kg": "kilogram kilograms kilo kilos kg kgs".split(),
    "g": "gram grams g".split(),
    "lb": "pound pounds lb lbs".split(),
    "oz": "ounce ounces oz".split(),
    "ton": "ton tons tonne tonnes".split(),
    "celsius": "celsius centigrade °c".split(),
    "fahrenheit": "fahrenheit °f".split(),
    "kelvin": "kelvin".split(),
    "l": "liter liters litre litres l".split(),
    "ml": "milliliter milliliters millilitre millilitres ml".split(),
    "gallon": "gallon gallons gal".split(),
    "cup": "cup cups".split(),
    "tbsp": "tablespoon tablespoons tbsp".split(),
    "tsp": "teaspoon teaspoons tsp".split(),
    "usd": "usd dollar dollars $ bucks".split(),
    "eur": "eur euro euros €".split(),
    "gbp": "gbp sterling £".split(),
    "jpy": "jpy yen ¥".split(),
    "inr": "inr rupee rupees".split(),
    "btc": "btc bitcoin bitcoins".split(),
    "ms": "millisecond milliseconds ms".split(),
    "s": "second seconds sec secs s".split(),
    "min": "minute minutes mins".split(),
    "h": "hour hours hr hrs h".split(),
    "day": "day days".split(),
    "week": "week weeks".split(),
    "month": "month months".split(),
    "year": "year years yr yrs".split(),
    "kb": "kb kilobyte kilobytes".split(),
    "mb": "mb megabyte megabytes".split(),
    "gb": "gb gigabyte gigabytes".split(),
    "tb": "tb terabyte terabytes".split(),
    "bit": "bit bits".split(),
    "byte": "byte bytes".split(),
    "nibble": "nibble nibbles".split(),
    "mph": "mph".split(),
    "kph": "kph km/h kmh".split(),
    "%": "% percent percentage pct".split(),
    "w": "watt watts w".split(),
    "kw": "kilowatt kilowatts kw".split(),
    "kwh": "kwh".split(),
    "v": "volt volts v".split(),
    "a": "amp amps ampere amperes".split(),
    "hz": "hz hertz".split(),
    "ghz": "ghz gigahertz".split(),
    "mhz": "mhz megahertz".split(),
    "cal": "calorie calories kcal cal".split(),
    "acre": "acre acres".split(),
    "hectare": "hectare hectares ha".split(),
    "sqft": "sqft".split(),
    "psi": "psi".split(),
    "bar": "bar".split(),
    "degree": "degree degrees °".split(),
    "radian": "radian radians rad".split(),
}
UNIT_OF = {w: canon for canon, words in UNITS.items() for w in words}
# Units that are everyday words too ("a cup of tea", "per day"): they count only after a number.
WEAK_UNITS = frozenset("""cup cups day days week weeks month months year years hour hours minute
    minutes second seconds degree degrees bit bits byte bytes nibble nibbles bar""".split())

# Tasks that transform given content: a different one asks for a different answer.
TASKS = {
    "summarize": "summarize summarise summary summarization summarisation tldr recap condense".split(),
    "translate": "translate translation translating".split(),
    "rewrite": "rewrite rephrase paraphrase reword".split(),
    "fix": "fix debug repair troubleshoot".split(),
    "proofread": "proofread grammar spelling".split(),
    "classify": "classify categorize categorise label".split(),
    "extract": "extract".split(),
    "sentiment": "sentiment".split(),
    "shorten": "shorten shorter abbreviate".split(),
    "expand": "expand elaborate lengthen longer".split(),
    "critique": "critique review evaluate assess grade".split(),
    "compare": "compare comparison versus vs difference differences differ".split(),
    "test": "test tests unittest".split(),
    "optimize": "optimize optimise".split(),
    "document": "document docstring docstrings comment comments".split(),
    "title": "title headline".split(),
    "keywords": "keywords tags".split(),
    "simplify": "simplify eli5".split(),
    "formal": "formal formalize".split(),
    "casual": "casual informal".split(),
    "poem": "poem haiku limerick sonnet".split(),
    "story": "story".split(),
    "email": "email letter".split(),
    "joke": "joke jokes".split(),
    "tweet": "tweet".split(),
}
TASK_OF = {w: t for t, words in TASKS.items() for w in words}

# Co-hyponym classes whose members swap easily and change the answer (lower-case).
ENTITY_CLASSES = {
    "language": """english french spanish german italian portuguese dutch russian chinese mandarin
        cantonese japanese korean arabic hindi bengali urdu turkish polish swedish norwegian danish
        finnish greek hebrew thai vietnamese indonesian malay swahili czech hungarian romanian ukrainian
        latin persian farsi tamil telugu""",
    "country": """france germany spain italy portugal netherlands belgium russia china japan korea
        india pakistan brazil argentina mexico canada usa america australia egypt nigeria kenya turkey
        poland sweden norway denmark finland greece israel iran iraq thailand vietnam indonesia
        switzerland austria ireland scotland england uk britain ukraine chile peru colombia""",
    "city": """paris london berlin madrid rome lisbon amsterdam brussels moscow beijing shanghai tokyo
        seoul delhi mumbai sydney melbourne toronto vancouver montreal cairo istanbul dubai singapore
        chicago boston seattle york angeles francisco miami dallas houston vienna prague warsaw dublin""",
    "proglang": """python java javascript typescript golang rust ruby php perl swift kotlin scala
        haskell c++ c# csharp cpp lua bash powershell sql r julia matlab elixir erlang clojure dart
        fortran cobol assembly html css""",
    "tech": """linux windows macos mac ios android ubuntu debian fedora centos docker kubernetes
        react vue angular svelte django flask fastapi rails node nodejs npm pip conda git github
        gitlab aws azure gcp postgres postgresql mysql sqlite mongodb redis kafka nginx apache chrome
        firefox safari excel powerpoint outlook gmail iphone ipad
        samsung numpy pandas pytorch tensorflow""",
    "planet": "mercury venus earth mars jupiter saturn uranus neptune pluto moon sun",
    "color": "red blue green yellow orange purple pink black white gray grey brown",
    "animal": """cat cats dog dogs horse horses cow cows bird birds fish rabbit rabbits snake snakes
        lion lions tiger tigers bear bears wolf wolves mouse mice spider spiders insect insects ant ants
        bee bees wasp wasps mosquito mosquitoes tick ticks snail snails worm worms frog frogs shark sharks
        whale whales dolphin dolphins pig pigs sheep goat goats duck ducks monkey monkeys elephant
        elephants deer fox foxes owl owls eagle eagles penguin penguins turtle turtles hamster hamsters
        parrot parrots rat rats""",
    "element": "hydrogen helium oxygen nitrogen carbon iron gold silver copper sodium",
}
ENTITY_WORDS = frozenset(w for words in ENTITY_CLASSES.values() for w in words.split())

# Common words that name different members of one kind, so that swapping one for another changes the
# answer ("time complexity" / "space complexity"), yet each may be added or dropped alone. Unlike
# an entity, a member counts only against another member of its class on the other side. No member
# is a synonym of another (so no "memory" beside "space", no "mean" beside "average"); words joined
# by "/" are one member ("often" / "frequently" is no swap, "often" / "sometimes" is).
CONTRAST_CLASSES = [
    "always usually/normally/generally/typically often/frequently sometimes/occasionally rarely/seldom",
    "with/during/while before after",  # when to take, eat or do it: "aspirin with / before alcohol"
    "past present future",
    "yesterday today tomorrow",
    "morning afternoon evening night",
    "day/daily week/weekly month/monthly year/yearly/annual/annually",
    "time space",  # cost of an algorithm, resource of a schedule
    "length width height depth",
    "area volume perimeter circumference",
    "speed acceleration",
    "addition subtraction multiplication division",
    "numerator denominator",
    "latitude longitude",
    "breakfast lunch dinner",
    "husband wife", "father mother", "son daughter", "brother sister", "uncle aunt", "king queen",
    "sunrise sunset",
    "noun verb adjective adverb",
    "sine cosine tangent",
    "virus bacteria",
    "weather climate",
    "vegan vegetarian",
    "debit credit",
    "stack queue",
]

# What a question asks for, with the other ways English asks it: "What makes the sky blue?" asks why,
# "What year was it built?" when, "In which city was Mozart born?" where. "what", "which" and "how"
# alone ask for anything and are no kind.
INTERROGATIVES = {
    "reason": """why | how come | what for | for what reason | what makes | what made | what causes
        | what caused | what is the reason | what's the reason | what was the reason | what are the reasons""",
    "time": """when | since when | what time | what year | what date | what day | what month | what decade
        | what century | what age | how long ago""",
    "place": """where | what place | which place | what location | in what city | in which city | in what country
        | in which country | what part of""",
    "person": "who | whom | whose | what person | which person",
    "amount": "how many | how much",
}

# The substitution guard (cache/substitution.py): words a paraphrase changes freely (function words,
# filler, prepositions), and the words that matter even among the stopwords: quantities, degrees,
# "this" against "next", "all" against "some", "or".
LIGHT_WORDS = (STOPWORDS | FILLER | frozenset("in on using into list convert show find up during".split())) - frozenset("""
much little many few more less most least all some any none each every either both or and but this that these
those than then too very lot lots bit without before after best good easy simple simply quickly right correct
exactly example examples definition since until""".split())

# Words a paraphrase swaps for each other in one place ("How often" / "How frequently"); the
# substitution guard lets such a swap pass. A slash joins the words of one group.
SYNONYM_GROUPS = """change/update/modify/edit fix/repair/solve/resolve buy/purchase big/large/huge small/tiny
car/automobile/vehicle film/movie kid/child start/begin/launch stop/end/quit make/create/build/prepare/cook
remove/delete/erase/uninstall use/utilize need/require get/obtain/receive/request find/locate show/display
help/assist reply/respond job/work/career error/issue/problem/bug shop/store price/cost fast/quick/rapid
recommend/suggest way/method learn/study sick/ill happy/glad phone/smartphone pc/computer/laptop
contact/reach often/frequently under/below always/keep near/close begin/commence run/execute/use
adult/grown-up finish/end/complete die/dying lie/lying day/daily week/weekly month/monthly year/yearly/annual
hour/hourly while/during pregnant/pregnancy best/ideal/top correct/right/proper good/nice/strong/great
strange/weird/odd kid/kids/child/children easy/simple pick/choose/select symptom/sign baby/infant
subscription/membership cut/chop end/terminate/cancel exercise/workout glasses/spectacles
licence/license tyre/tire centre/center theatre/theater metre/meter litre/liter fibre/fiber grey/gray
mould/mold analyse/analyze several/multiple/various""".split()


# The qualifier guard (``cache/substitution.py``: one question is the other with words added).
# Added words that leave the answer as it was: modifiers that restrict nothing ("the (current) CEO",
# "the (main) symptoms", "delete my account (permanently)": a re-check QA's paraphrases).
NONRESTRICTIVE = frozenset("""current official main common basic exact general famous actual overall typical
    usual standard primary major permanently officially originally commonly mainly technically safely
    efficiently locally actually really exactly basically generally usually typically properly easily
    simply briefly away""".split())
# nouns that name the kind of the thing named next ("the (acronym) FOMO", "the (planet) Earth")
CLASSIFIERS = frozenset("word term acronym abbreviation phrase element planet country city company language name".split())
# adverbs that change the answer wherever they stand, before a preposition too ("take it (daily) with",
# "fly (early) while", "Do I (still) need")
QUALIFYING_ADVERBS = frozenset("""daily alone hard early late direct still ever always never already again just
    only yet even too very""".split())
# the quantity and degree words among the stopwords, which change the answer added anywhere too
# ("Are (all) mushrooms poisonous?", "(a little) milk")
QUANTITY_WORDS = frozenset("all some any every each both most many much few little lot least more less several".split())
# words before which an added generic noun names what was there ("a SQL (query) to", "the capital (city) of")
LINKING = frozenset("of in on at to for from with by about into onto over under until than between the a an that which".split())
# what a question about the user's own setting ends with, without changing the answer
SETTING_TAILS = ("at home", "online", "myself", "in general", "for me", "step by step", "in simple terms",
                 "in simple words", "in plain english")
# a phrase added in the middle of a question that opens with one of these narrows what it asks:
# "the life expectancy (of men) in Japan", "the GDP (per capita) of China" (found by QA)
NARROWING_PREPOSITIONS = frozenset("of in on at for from with by about per among within during under over".split())
# words that, added before one of the words listed with them, name what the word before them was,
# where another noun names a different thing ("a SQL (query) to" / "the GDP (growth) of"). Only
# before those words: "the color (code) of", "the cost (function) of" and "How many seats are (left)
# on" name other things (found by a re-check QA); None: before any linking word
_CODE_HEADS = "query queries statement command code script snippet program function expression syntax value"
GENERIC_HEADS: dict[str, tuple[str, ...] | None] = {
    **{w: ("to", "that", "which") for w in _CODE_HEADS.split()},  # "a SQL (query) to", "a string (value) to"
    **{w: ("until",) for w in "left remaining".split()},  # "How many days (are left) until …?"
    # the verbs that say what a thing counts as: "Is Pluto (considered) a planet?"
    **{w: None for w in "considered regarded classified counted called known defined deemed viewed seen".split()},
}
# phrases that, added anywhere, leave the question as it was ("How long does it take (on average) to
# …", "What is, (by definition), …"; found by a re-check QA)
NEUTRAL_PHRASES = ("on average", "in short", "by definition", "in general", "in practice", "for example",
                   "for instance", "in simple terms", "in simple words", "in total", "at all", "in brief",
                   "in summary", "in essence", "in fact", "in plain english", "generally speaking")
SETTING_POSSESSIVE = frozenset("on in at with from using".split())  # "on my laptop", "in my browser"
YES_NO_STARTS = frozenset("is are was were do does did can could will would should shall has have had may might must".split())
