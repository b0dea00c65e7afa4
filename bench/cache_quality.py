"""Semantic-cache answer quality on a labelled set of request pairs (bench/cache_pairs.jsonl).

For each pair, entry A is cached and request B looks it up. B should hit for paraphrases and
must not hit for hard negatives (negation, entity/number/unit swaps, task changes, related
questions) nor for multi-turn follow-ups whose earlier turns differ. Reports, per category and
threshold, the hit rate with the cosine threshold alone and with the verifier, for each split:
"dev" (the guards were developed against it), "heldout" (first measured after the guards were
written; some general lexicon gaps it revealed were then filled, so it is no longer clean),
"heldout2" (written after that, never used to change the verifier), "heldout3" (direction
swaps, comparatives and word-order paraphrases, written together with the order-aware guard's
"dev" pairs but before the guard was run on them, and never used to change it), "qa" (the third
cache QA's false hits: other scripts, accents, question words, one-word swaps; with paraphrases
for the guards they led to, which were written against it), "heldout4" (pairs of those kinds
written before those guards ran on them, and never used to change them), "qa4" (the cache re-check
QA's Latin-script pairs, /tmp/qa_recheck pairs2.jsonl and three of pairs1.jsonl: negations and
on/off swaps in 20 other languages, "dısable" typed with a dotless ı, two French/Spanish
near-duplicates) and "heldout5" (English keyword-style queries, and English requests quoting another
language, written before the English-text rule (cache/language.py) ran on them; its share of two
thirds was then chosen among candidates measured on the whole set, this split included), "qa5" (a
cache QA's same-sentence swaps, which led to the substitution guard) and "heldout6" (swaps and in-place
synonym paraphrases written before that guard ran on them; one of its paraphrases then led to reading a
synonym's comparative forms as the synonym), "qa6" (a cache QA's modal, logic, role, code-layout, SQL,
date and format pairs, which led to the logic, role and layout guards, cache/logic.py) and "heldout7"
(pairs of those kinds written by someone who had not seen those guards, before they ran on it; some of
its misses then extended them) and "qa7" (a re-check QA's pairs written to get around those guards, and
paraphrases they refused; its misses led to the guards' second version), "qa8" (a cache QA's added
qualifiers, "Is Pluto a (dwarf) planet?", and unit swaps without numbers, which led to the qualifier
guard, with paraphrases written against that guard), "qa9" (a re-check QA's added-word negatives and
paraphrases, written against the qualifier guard's first version; its second was written from them)
and "heldout8" (120 pairs written blind to the guards and this file, before they ran on them) and
"heldout9" (60 pairs about persons, my / your, I / you, written blind the same way; it led to the person
guard's second version and its clause rule, cache/persons.py) and "heldout10" (60 pairs about who does
what to whom, written blind; it led to the owner rule) and "qa10" (a cache QA's four added-word false
hits, "the GDP (per capita) of", with negatives and paraphrases of their shapes written together with
the two rules they led to) and "qa11" (a re-check QA's added-word pairs written against those two rules;
the rules' next version was written from its findings, so it is not clean either) and "qa12" (a third
re-check's added-word false hits and refused paraphrases, against that version; the third version
was written from its false hits) and "heldout11" (150 everyday questions, 75 paraphrases and 75 hard
negatives, written blind to the guards, this file and the README by a QA, before they ran on them) and
"heldout12" (160 pairs, 80 paraphrases heavy on abbreviations, synonyms, chat framing and typos and
80 hard negatives of those shapes, written blind the same way, before the shorthand reading,
cache/shorthand.py, ran on them; measured once with its first version, whose later changes some
of its refusals led to: degrees, "tell me the", "latest") and "qa13" (a QA's 98 hard negatives and
41 paraphrases written against that first version: abbreviations with other meanings, names,
aliases, framing, modals after a leading clause; the second version was written from its finds)
and "qa14" (a second QA's 106 hard negatives and 37 paraphrases against that second version: aliases
of a continent or a machine, "latest" / "last", other meanings of AI, ML, hr, "cant", titles that
open with a greeting, leading clauses over rules and advice; the third was written from its finds),
and "heldout13" (160 pairs written blind to the code, the sets and the README: paraphrases, and hard
negatives in twelve kinds, tense among them; the tense rule was written from its false hits) and
"qa15" (a re-check QA's 155 pairs against that rule's first version and the day's other rules).
"original"
is the first four splits, the 282 pairs before "qa".

Exact repeats are exact-tier hits; a text with no semantic tier (``SemanticCache._prepare``:
not English in Latin letters, or letters the embedder does not see) is served only by the exact
tier, whatever its cosine: its "+verif" column counts it as a miss.

    .venv/bin/python bench/cache_quality.py [--split all|original|dev|heldout|...|qa8|before-qa7] [--e2e]

--e2e also runs every pair through the real SemanticCache (Redis DB 4) at the default
threshold and checks it agrees with the offline computation.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from cache.canonical import canonicalize  # noqa: E402
from cache.embedder import Embedder  # noqa: E402
from cache.shorthand import for_embedding  # noqa: E402
from cache.verifier import Verifier  # noqa: E402

PAIRS = Path(__file__).with_name("cache_pairs.jsonl")
THRESHOLDS = [0.70, 0.75, 0.80, 0.85, 0.90, 0.95]
DEFAULT_T = 0.90  # the gateway's default (PAGEGATE_CACHE_THRESHOLD)
SUMMARY_T = (0.85, DEFAULT_T)
SPLITS = ["dev", "heldout", "heldout2", "heldout3", "qa", "heldout4", "qa4", "heldout5", "qa5", "heldout6", "qa6", "heldout7", "qa7", "qa8", "qa9", "heldout8", "heldout9", "heldout10", "qa10", "qa11", "qa12", "heldout11", "heldout12", "qa13", "qa14", "heldout13", "qa15"]
ORIGINAL = SPLITS[:4]


def body(text: str, history: list[dict] | None) -> dict:
    return {"model": "m", "temperature": 0, "messages": [*(history or []), {"role": "user", "content": text}]}


def load(split: str) -> list[dict]:
    rows = [json.loads(line) for line in PAIRS.read_text().splitlines() if line.strip()]
    if split.startswith("before-"):  # the splits written before that one: "before-qa7" is the 893 pairs
        return [r for r in rows if SPLITS.index(r["split"]) < SPLITS.index(split[len("before-"):])]
    return [r for r in rows if split == "all" or r["split"] == split or (split == "original" and r["split"] in ORIGINAL)]


async def score(rows: list[dict], emb: Embedder) -> tuple[np.ndarray, list[bool], float]:
    """Cosine of each pair (-1 when B's namespace differs from A's; 1 for an exact repeat) and
    whether the semantic tier serves it above the threshold: both texts have one, and the verifier
    passes it. The time is the verifier's alone."""
    texts = sorted({r["a"] for r in rows} | {r["b"] for r in rows})
    vecs = dict(zip(texts, await emb.embed_many([for_embedding(t) for t in texts]), strict=True))  # (as SemanticCache)
    verifier = Verifier(vocab=emb.vocab())
    searchable = {t: verifier.reads(t) and await emb.sees(t) for t in texts}
    sims, ok = [], []
    spent = 0.0
    for r in rows:
        ca = canonicalize("tenant", body(r["a"], r.get("history_a")))
        cb = canonicalize("tenant", body(r["b"], r.get("history_b")))
        same_ns = ca.context_key == cb.context_key
        exact = ca.exact_key == cb.exact_key
        sims.append(1.0 if exact else float(vecs[r["a"]] @ vecs[r["b"]]) if same_ns else -1.0)
        t0 = time.perf_counter()
        passed = verifier.check(r["b"], r["a"]).ok
        spent += time.perf_counter() - t0
        ok.append(exact or (passed and searchable[r["a"]] and searchable[r["b"]]))
    return np.array(sims), ok, spent / max(1, len(rows)) * 1e6


def report(rows: list[dict], sims: np.ndarray, ok: list[bool], title: str) -> dict:
    cats = sorted({r["cat"] for r in rows}, key=lambda c: (c != "paraphrase", c))
    print(f"\n### {title} ({len(rows)} pairs)\n")
    head = "| category | n | " + " | ".join(f"{t:.2f} cos / +verif" for t in THRESHOLDS) + " |"
    print(head)
    print("|" + "---|" * (2 + len(THRESHOLDS)))
    summary = {}
    for cat in [*cats, "ALL NEGATIVES"]:
        idx = [i for i, r in enumerate(rows) if (r["cat"] == cat if cat != "ALL NEGATIVES" else r["expect"] == "miss")]
        if not idx:
            continue
        cells = []
        for t in THRESHOLDS:
            hit_cos = sum(sims[i] >= t for i in idx) / len(idx)
            hit_ver = sum(sims[i] >= t and ok[i] for i in idx) / len(idx)
            cells.append(f"{hit_cos:6.1%} / {hit_ver:6.1%}")
            summary[(cat, t)] = (hit_cos, hit_ver)
        print(f"| {cat} | {len(idx)} | " + " | ".join(cells) + " |")
    print("\n(paraphrase: hit rate, higher is better; every other row: false-hit rate, lower is better)")
    return summary


async def e2e(rows: list[dict], emb: Embedder, threshold: float) -> None:
    import redis.asyncio as aioredis

    from cache.api import CachePolicy
    from cache.semantic_cache import SemanticCache

    prefix = f"bench-quality-{os.getpid()}:"
    r = aioredis.Redis.from_url("redis://127.0.0.1:6379/4")
    cache = SemanticCache(r, emb, prefix=prefix)
    policy = CachePolicy(threshold=threshold)
    resp = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "stop"}]}
    got = {"hit": 0, "miss": 0}
    wrong = 0
    try:
        for i, row in enumerate(rows):
            ns = f"pair-{i}"
            await cache.store(ns, body(row["a"], row.get("history_a")), resp, policy)
            out = await cache.lookup(ns, body(row["b"], row.get("history_b")), policy)
            hit = out.outcome in ("hit", "semantic-hit")
            got["hit" if hit else "miss"] += 1
            wrong += hit != (row["expect"] == "hit")
    finally:
        async for k in r.scan_iter(match=prefix + "*", count=1000):
            await r.delete(k)
        await r.aclose()
    print(f"\nend-to-end through SemanticCache + Redis at {threshold}: {got}, wrong outcomes {wrong}/{len(rows)}")


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--split", default="each",
                    choices=["each", "all", "original", *SPLITS, *(f"before-{x}" for x in SPLITS[1:])])
    ap.add_argument("--e2e", action="store_true")
    args = ap.parse_args()
    emb = Embedder()
    await emb.ready()
    splits = [*SPLITS, "original", "all"] if args.split == "each" else [args.split]
    for split in splits:
        rows = load(split)
        sims, ok, us = await score(rows, emb)
        s = report(rows, sims, ok, f"split={split}")
        print()
        for t in SUMMARY_T:
            p, n = s.get(("paraphrase", t)), s.get(("ALL NEGATIVES", t))  # (a split may hold only one kind)
            print(f"at {t:.2f}: " + "; ".join(filter(None, (
                p and f"paraphrase hit {p[0]:.1%} -> {p[1]:.1%} with verifier",
                n and f"false hits {n[0]:.1%} -> {n[1]:.1%}", f"verifier {us:.0f} us/pair"))))
        if split == "all":
            for i, r in enumerate(rows):  # what the verifier still gets wrong at the default threshold
                hit = sims[i] >= DEFAULT_T and ok[i]
                if hit != (r["expect"] == "hit") and (r["expect"] == "miss" or sims[i] >= DEFAULT_T):
                    print(f"  wrong: {r['id']} ({r['split']}) cos={sims[i]:.3f} {r['a']!r} / {r['b']!r}")
    if args.e2e:
        await e2e(load("all"), emb, DEFAULT_T)
    emb.close()


if __name__ == "__main__":
    asyncio.run(main())
