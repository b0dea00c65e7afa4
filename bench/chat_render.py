"""Chat rendering on the event loop: ``ChatRenderer.render`` (the compiled template rendered
directly, ``engine.tokenizer.ChatTemplate``) against the same renderer with that path switched off
(transformers' ``apply_chat_template(tokenize=False)`` every call), alternated in one process, with
the ids checked equal on every chat.

    python bench/chat_render.py [--rounds 5] [--calls 2000]

Chats: a short one (one user turn) and a multi-turn one with a system prompt, the shapes the
gateway renders per request. Prints µs per render for each path and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.tokenizer import ChatRenderer, load_tokenizer  # noqa: E402
from engine.weights import resolve_model_dir  # noqa: E402

CHATS = {
    "short": [{"role": "user", "content": "Say hi."}],
    "multi-turn": [{"role": "system", "content": "You are a terse assistant for ACME Corp."},
                   {"role": "user", "content": "What is the capital of France?"},
                   {"role": "assistant", "content": "Paris."},
                   {"role": "user", "content": "And of Germany?"}],
}


def per_call_us(renderer: ChatRenderer, chat: list[dict], calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        renderer.render(chat)
    return (time.perf_counter() - t0) / calls * 1e6


def main(args: argparse.Namespace) -> None:
    tok = load_tokenizer(resolve_model_dir("smollm2-135m-instruct", str(Path(args.weights))))
    direct = ChatRenderer(tok)
    plain = ChatRenderer(tok)
    plain._template = None  # the baseline: apply_chat_template on every call
    if direct._template is None:
        sys.exit("this tokenizer's template does not take the direct path: nothing to compare")
    print(f"{args.rounds} rounds x {args.calls} renders per path and chat, alternated")
    for name, chat in CHATS.items():
        assert direct.render(chat) == plain.render(chat), name  # the same ids
        fast, slow = [], []
        for _ in range(args.rounds):
            fast.append(per_call_us(direct, chat, args.calls))
            slow.append(per_call_us(plain, chat, args.calls))
        f, s = statistics.median(fast), statistics.median(slow)
        print(f"  {name:<11} direct {f:6.1f} µs, apply_chat_template {s:6.1f} µs per render: {s / f:.2f}x")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--weights", default="./data/weights", help="the converted weights' cache directory")
    main(ap.parse_args())
