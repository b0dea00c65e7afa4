"""``pagegate generate "prompt"``: the engine alone, without the gateway. Renders the prompt with
the model's chat template, streams the completion to stdout as it is generated, and prints a
one-line summary (tokens, time to first token, speed) to stderr.

Engine settings come from ``Settings`` (``PAGEGATE_*``); the flags below override them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid

from gateway.settings import Settings, miscased_refusal, settings_errors, unknown_settings


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "generate", help="generate a completion with the in-process engine (no server)",
        description="Stream a chat completion from the in-process engine to the terminal.",
    )
    p.add_argument("prompt", help='the user message ("-" reads it from stdin)')
    p.add_argument("--system", help="system message")
    p.add_argument("--raw", action="store_true", help="send the prompt as is, without the chat template")
    p.add_argument("--max-tokens", type=int, default=256, help="most tokens to generate (default 256)")
    p.add_argument("--temperature", type=float, default=0.7, help="0 = greedy (default 0.7)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default 1.0)")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (0 = off)")
    p.add_argument("--seed", type=int, help="makes sampling reproducible")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence")
    p.add_argument("--json", action="store_true", dest="json_object",
                   help="JSON mode: the answer is one JSON object (say so in the prompt)")
    p.add_argument("--model", help="model id or local HF directory (default: PAGEGATE_MODEL)")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], help="weights dtype")
    p.add_argument("--device", help='"auto", "cpu", "cuda" or "cuda:N"')
    p.add_argument("--quiet", action="store_true", help="no loading message and no summary line")
    p.set_defaults(func=run)


def engine_config_from_args(args: argparse.Namespace, settings: Settings | None = None):
    """The engine's config: settings from the environment, CLI flags on top."""
    settings = settings or Settings()
    overrides = {k: v for k, v in (("model", args.model), ("dtype", args.dtype), ("device", args.device))
                 if v is not None}
    if overrides:
        settings = settings.model_copy(update=overrides)
    return settings.engine_config()


def sampling_params_from_args(args: argparse.Namespace):
    from engine.sampling_params import SamplingParams

    return SamplingParams(
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
        max_tokens=args.max_tokens, stop=list(args.stop), ignore_eos=args.ignore_eos,
        json_object=args.json_object,
    )


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from engine.llm_engine import DeviceUnavailable

    # the settings' names, as `serve` and the admin CLI read them (found by QA: generate read
    # PAGEGATE_block_size and ignored PAGEGATE_BLOKC_SIZE in silence)
    if (miscased := miscased_refusal()) is not None:
        print(f"error: {miscased}", file=sys.stderr)
        return 2
    for name, meant in unknown_settings():
        print(f"warning: {name} is not a pagegate setting: ignored" + (f" (did you mean {meant}?)" if meant else ""),
              file=sys.stderr)
    try:
        prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
        for text in (prompt, args.system, *args.stop):
            if text is not None:
                text.encode("utf-8")  # (undecodable bytes arrive as lone surrogates: the tokenizer fails)
    except UnicodeError:
        print("error: the prompt, system message or a stop string is not valid UTF-8 text", file=sys.stderr)
        return 2
    if args.raw and not prompt:  # (found by QA: refused only after loading the model, in token-id words)
        print("error: the prompt is empty: --raw sends it as it is, and the model needs at least one token",
              file=sys.stderr)
        return 2
    try:
        params = sampling_params_from_args(args)
        config = engine_config_from_args(args)
    except ValidationError as exc:  # a PAGEGATE_* setting of the wrong type, as `serve` words it
        print(f"error: invalid settings: {settings_errors(exc)}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_generate(config, prompt, args.system, params, raw=args.raw, quiet=args.quiet))
    except DeviceUnavailable as exc:
        if not args.device:
            print(f"\nerror: {exc}", file=sys.stderr)
        else:  # the flag was the cause, not the setting (found by QA: the hint named the setting)
            print(f"\nerror: device {exc.name!r}, but this torch sees no CUDA GPU; use --device cpu or auto",
                  file=sys.stderr)
        return 2
    except ValueError as exc:  # unknown model, bad directory, prompt too long
        print(f"\nerror: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `... | head`: the reader has what it wanted (a QA find: a traceback)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (no second error at exit's flush)
        return 0


async def _generate(config, prompt: str, system: str | None, params, *, raw: bool, quiet: bool) -> int:
    from engine.async_engine import AsyncEngine
    from engine.outputs import EngineError

    def note(msg: str) -> None:
        if not quiet:
            print(msg, file=sys.stderr, flush=True)

    note(f"loading {config.model} ...")
    t0 = time.perf_counter()
    engine = AsyncEngine(config)
    try:
        await engine.start()
    except ValueError:  # (DeviceUnavailable too): worded already
        raise
    except Exception as exc:  # (found by QA: a weights cache that cannot be made, a damaged GGUF, a
        # config.json that does not fit: a traceback) one line, with what went wrong
        raise ValueError(f"cannot load the model {config.model}: {type(exc).__name__}: {exc}") from exc
    note(f"loaded {engine.model_id} in {time.perf_counter() - t0:.1f}s")
    try:
        if raw:
            ids = engine.encode(prompt)
        else:
            messages = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": prompt}
            ]
            ids = engine.encode_chat(messages)
        start = time.perf_counter()
        first = None
        finish, completion = None, 0
        try:
            async for out in engine.generate(ids, params, request_id=f"cli-{uuid.uuid4().hex[:12]}"):
                for delta in out.deltas:
                    # the first token, even one a stop string holds back (no text yet)
                    if first is None and delta.num_tokens:
                        first = time.perf_counter() - start
                    if delta.text:
                        sys.stdout.write(delta.text)
                        sys.stdout.flush()
                    completion = delta.num_tokens
                    finish = delta.finish_reason or finish
        except EngineError as exc:
            print(f"\nerror: {exc}", file=sys.stderr)
            return 1
        elapsed = time.perf_counter() - start
        sys.stdout.write("\n")
        sys.stdout.flush()
        speed = completion / elapsed if elapsed > 0 else 0.0
        ttft = f"{first * 1000:.0f} ms" if first is not None else "n/a"
        note(f"[{len(ids)} prompt + {completion} completion tokens, finish={finish}, "
             f"TTFT {ttft}, {speed:.1f} tok/s]")
        return 0
    finally:
        await engine.shutdown()
