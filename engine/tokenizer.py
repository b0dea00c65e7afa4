"""The model's tokenizer (Hugging Face, from the model directory) and chat rendering."""

from __future__ import annotations

from pathlib import Path


def load_tokenizer(model_dir: str | Path):
    """The directory's tokenizer, or None when it has no tokenizer files (token-id-only use)."""
    model_dir = Path(model_dir)
    if not any((model_dir / f).exists() for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def _text_of(content) -> str:
    """OpenAI message content: a string, or a list of parts of which the text ones count."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, dict) and part.get("type", "text") == "text":
            parts.append(str(part.get("text", "")))
        elif isinstance(part, str):
            parts.append(part)
        else:
            raise ValueError("only text content parts are supported")
    return "".join(parts)


def render_chat(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of ``messages`` under the tokenizer's chat template, generation prompt added."""
    if tokenizer is None:
        raise ValueError("this model has no tokenizer; send token ids")
    msgs = [{"role": m["role"], "content": _text_of(m.get("content"))} for m in messages]
    if getattr(tokenizer, "chat_template", None):
        # render, then encode with the Rust tokenizer directly: the same ids as
        # apply_chat_template(tokenize=True) (which encodes without special tokens too), ~30% less
        # Python on the request path
        text = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None:
            return backend.encode(text, add_special_tokens=False).ids
        return tokenizer.encode(text, add_special_tokens=False)
    text = "".join(f"{m['role']}: {m['content']}\n" for m in msgs) + "assistant:"
    return tokenizer.encode(text)
