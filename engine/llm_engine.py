"""The synchronous engine core. One ``step()`` reads top to bottom:

    schedule -> run the model -> sample -> postprocess (detokenize, stops, free finished)

It is not thread-safe; ``AsyncEngine`` drives it from its own thread.
"""

from __future__ import annotations

import itertools
import logging
import time
from pathlib import Path

import torch

import kernels
from engine.config import EngineConfig
from engine.detokenizer import IncrementalDetokenizer
from engine.json_decoding import OPEN, JsonDecoding
from engine.kv_cache_manager import KVCacheManager
from engine.model import LlamaModel
from engine.model_runner import ModelRunner, kv_bytes_per_block
from engine.outputs import CompletionDelta, EngineStats, RequestOutput, check_prompt
from engine.request import Request, RequestId, Sequence
from engine.sampler import Sampler
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler, SchedulerOutput
from engine.tokenizer import load_tokenizer

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class DeviceUnavailable(ValueError):
    """A device this torch cannot use; ``name`` is the one asked for (each front names its own knob)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"device {name!r}, but this torch sees no CUDA GPU (torch {torch.__version__}); "
                         "use PAGEGATE_DEVICE=cpu or auto")
        self.name = name


def resolve_device(name: str) -> torch.device:
    """``auto``: the GPU when torch sees one. A CUDA device this torch cannot use is a ValueError
    (torch's own is an AssertionError deep inside the model's load)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DeviceUnavailable(name)
    return device


def available_memory(device: torch.device) -> int | None:
    """Bytes a new allocation can take on ``device``: the GPU's free memory, or the host's
    ``MemAvailable`` (Linux); None where it is not known."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_kv_pool(pool_bytes: float, device: torch.device) -> None:
    """A KV pool larger than the memory left on its device is refused up front: allocated, it would
    get the process killed by the kernel's OOM killer (or, for an absurd size, never finish)."""
    free = available_memory(device)
    if free is not None and pool_bytes > free:
        raise ValueError(f"a KV cache of {pool_bytes / 2**30:,.1f} GiB (PAGEGATE_KV_CACHE_MEMORY_GB) does not fit "
                         f"the {free / 2**30:,.1f} GiB of memory available on {device.type}; lower it")


def check_backend(name: str, device: torch.device) -> None:
    """The attention backend runs on ``device``: the Triton kernels need a GPU, or on a CPU Triton's
    interpreter (``TRITON_INTERPRET=1``, tests). Refused here, before the weights load (found by
    QA: it failed at the first step, for every request, with a traceback)."""
    if kernels.resolve_backend(name, device) != "triton" or device.type == "cuda":
        return
    try:
        from kernels import triton_attention

        triton_attention.require_runnable(device, triton_attention._paged_attention_kernel)
    except (ImportError, RuntimeError) as exc:
        raise ValueError(f"attention_backend 'triton' cannot run on {device.type}: {exc}") from None


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[name]


class LLMEngine:
    def __init__(self, config: EngineConfig, *, model_dir: str | Path | None = None) -> None:
        self.config = config
        device = resolve_device(config.device)
        check_backend(config.attention_backend, device)
        dtype = resolve_dtype(config.dtype, device)
        if config.num_threads and device.type == "cpu":
            torch.set_num_threads(config.num_threads)
        self.model_dir = Path(model_dir) if model_dir is not None else self._resolve_model_dir(config)
        self.model = LlamaModel.from_dir(self.model_dir, device, dtype, config.linear_backend)
        self.tokenizer = load_tokenizer(self.model_dir)
        arch, bs = self.model.arch, config.block_size
        block_bytes = kv_bytes_per_block(self.model, bs)
        num_blocks = config.num_blocks or max(2, int(config.kv_cache_memory_gb * 2**30) // block_bytes)
        check_kv_pool(num_blocks * block_bytes, device)
        if config.max_model_len and config.max_model_len > arch.max_position_embeddings:
            raise ValueError(
                f"max_model_len {config.max_model_len} exceeds the model's {arch.max_position_embeddings}"
            )
        # a single sequence must always fit in the pool, so preemption can never deadlock
        self.max_model_len = min(config.max_model_len or arch.max_position_embeddings, num_blocks * bs)
        if config.max_model_len and self.max_model_len < config.max_model_len:  # (found by QA: said nowhere)
            logger.warning("max_model_len %d is capped at %d, what the KV cache pool holds (%d blocks of %d "
                           "tokens): give the pool more memory or blocks for the whole context",
                           config.max_model_len, self.max_model_len, num_blocks, bs)
        eos = set(arch.eos_token_ids)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = sorted(eos)
        self.kv = KVCacheManager(num_blocks, bs, config.enable_prefix_caching)
        self.scheduler = Scheduler(
            self.kv, max_num_batched_tokens=config.max_num_batched_tokens, max_num_seqs=config.max_num_seqs
        )
        backend = kernels.resolve_backend(config.attention_backend, device)
        self.runner = ModelRunner(
            self.model, num_blocks=num_blocks, block_size=bs,
            max_num_batched_tokens=config.max_num_batched_tokens, max_num_seqs=config.max_num_seqs,
            attention_backend=backend,
        )
        # tokens decoded to no text (EOS, the tokenizer's special tokens): a choice that stops on
        # one lists no logprobs entry for it, as its text has none
        specials = getattr(self.tokenizer, "all_special_ids", None) or []
        self._silent_ids = frozenset(self.eos_token_ids) | frozenset(specials)
        self._with_logprobs = 0  # requests in ``requests`` that asked for logprobs
        self.json = JsonDecoding(self.tokenizer, self._silent_ids, self.eos_token_ids, self.model.arch.vocab_size,
                                 self.model.device)
        self.sampler = Sampler(self.eos_token_ids, seed=config.seed, json=self.json)
        self.requests: dict[RequestId, Request] = {}
        self._abort_outputs: list[RequestOutput] = []
        self._ids = itertools.count()
        self.num_steps = 0
        self.num_generated_tokens = 0

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLMEngine:
        return cls(config)

    @staticmethod
    def _resolve_model_dir(config: EngineConfig) -> Path:
        from engine.weights import resolve_model_dir

        return Path(resolve_model_dir(config.model, config.weights_cache_dir))

    # ---- requests -----------------------------------------------------------------------
    def add_request(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, *,
        salt: str | None = None, priority_class: str | None = None,
    ) -> None:
        """Queue a request. Raises ``PromptTooLongError`` when ``prompt + 1 > max_model_len``."""
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        prompt_token_ids = list(prompt_token_ids)  # (a NumPy array too: found by a re-check)
        # what every front checks (floats or a bad salt crashed the step: QA), then as Python's ints
        check_prompt(prompt_token_ids, params, self.max_model_len, self.model.arch.vocab_size, salt)
        prompt_token_ids = [int(t) for t in prompt_token_ids]
        req = Request(RequestId(request_id), prompt_token_ids, params, salt=salt,
                      priority_class=priority_class)
        self._init_seq(req.sequences[0])
        self.requests[req.request_id] = req
        if params.logprobs is not None:
            self._with_logprobs += 1
        self.scheduler.add(req.sequences[0])

    def _init_seq(self, seq: Sequence) -> None:
        seq.detok = IncrementalDetokenizer(self.tokenizer, seq.request.prompt_token_ids, seq.params.stop)
        self.json.start(seq)

    def prepare_json(self) -> None:
        """Build JSON mode's masks now (``AsyncEngine.start`` does, off the event loop), so the
        first JSON-mode request does not hold every request's step for it (found by QA)."""
        if self.tokenizer is not None:
            self.json.prepare()

    def abort_request(self, request_id: str) -> bool:
        """Drop a request now (its blocks return to the pool); the next ``step()`` reports it
        finished with reason "abort". Returns False for an unknown or finished request."""
        req = self.requests.pop(RequestId(request_id), None)
        if req is None:
            return False
        if req.params.logprobs is not None:
            self._with_logprobs -= 1
        req.aborted = True
        deltas = []
        for seq in req.sequences:
            if not seq.is_finished:
                self.scheduler.finish(seq)
                seq.finish_reason = "abort"
                deltas.append(CompletionDelta(seq.index, "", [], "abort", seq.num_output_tokens))
        req.metrics.finished_time = time.monotonic()
        self._abort_outputs.append(self._output(req, deltas))
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests) or bool(self._abort_outputs)

    # ---- the step -----------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        outputs, self._abort_outputs = self._abort_outputs, []
        sched = self.scheduler.schedule()
        if sched.is_empty:
            return outputs
        self._mark_scheduled(sched)
        logits, sample_idx, prompt_rows = self.runner.run(sched, self.kv)
        if prompt_rows:
            self._score_prompts(sched, prompt_rows)
        seqs, rows = self._advance(sched, sample_idx)
        logits = logits[rows] if len(rows) != len(sample_idx) else logits
        # logprobs: nothing at all while no request asks (the common case); then the sampler's
        # penalties may write into the logits (the model's own are needed only for logprobs)
        with_logprobs = self._with_logprobs
        with torch.inference_mode():  # the runner's logits are inference tensors: written only in this mode
            tokens = self.sampler.sample(logits, seqs, scratch=not with_logprobs)
            logprobs = self.sampler.logprobs(logits, seqs, tokens) if with_logprobs else None
        outputs += self._postprocess(seqs, tokens, logprobs)
        self.num_steps += 1
        return outputs

    def _score_prompts(self, sched: SchedulerOutput, prompt_rows: list[tuple[int, int, torch.Tensor]]) -> None:
        """Fill in the prompt logprobs of the positions this step computed (``prompt_logprobs``);
        a prefill computed again after a preemption writes the same positions again."""
        with torch.inference_mode():
            for i, first, hidden in prompt_rows:
                req = sched.seqs[i].request
                if req.prompt_logprobs is None:
                    req.prompt_logprobs = [None] * req.num_prompt_tokens
                targets = req.prompt_token_ids[first + 1 : first + 1 + hidden.shape[0]]
                entries = self.sampler.prompt_logprobs(self.model.compute_logits, hidden, targets,
                                                       req.params.prompt_logprobs)
                req.prompt_logprobs[first + 1 : first + 1 + len(entries)] = entries

    def _mark_scheduled(self, sched: SchedulerOutput) -> None:
        now = time.monotonic()
        for seq in sched.seqs:
            m = seq.request.metrics
            if m.queue_time is None:
                m.queue_time = now - m.arrival_time

    def _advance(self, sched: SchedulerOutput, sample_idx: list[int]) -> tuple[list[Sequence], list[int]]:
        """Count the computed tokens and fork ``n > 1`` requests whose prompt just finished.
        Returns the sequences to sample and, for each, its row in the logits."""
        for seq, n in zip(sched.seqs, sched.num_new_tokens, strict=True):
            seq.num_computed_tokens += n
        seqs = [sched.seqs[i] for i in sample_idx]
        rows = list(range(len(seqs)))
        for row, seq in enumerate(list(seqs)):
            req = seq.request
            if req.params.n > 1 and not req.forked:
                req.forked = True
                for index in range(1, req.params.n):
                    child = Sequence(req, index, list(seq.token_ids), seq.num_prompt_tokens,
                                     num_computed_tokens=seq.num_computed_tokens)
                    self._init_seq(child)
                    req.sequences.append(child)
                    self.kv.fork(seq, child)
                    self.scheduler.add_running(child, after=req.sequences[index - 1])
                    seqs.append(child)
                    rows.append(row)
        return seqs, rows

    def _postprocess(self, seqs: list[Sequence], tokens: list[int], logprobs: list | None = None,
                     ) -> list[RequestOutput]:
        """``logprobs``: ``Sampler.logprobs``' per row (None: no row asked)."""
        now = time.monotonic()
        deltas: dict[RequestId, list[CompletionDelta]] = {}
        generated = 0
        for row, (seq, tok) in enumerate(zip(seqs, tokens, strict=True)):
            req, m = seq.request, seq.request.metrics
            if seq.params.max_tokens == 0:  # the prompt computed (scored, or only cached): nothing generated
                seq.finish_reason = "length"
                self.scheduler.finish(seq)
                lp = None if seq.params.logprobs is None else []
                deltas.setdefault(req.request_id, []).append(CompletionDelta(seq.index, "", [], "length", 0, lp))
                continue
            generated += 1
            seq.token_ids.append(tok)
            if m.ttft is None:
                m.ttft = now - m.arrival_time
            elif seq.index == 0 and seq.last_token_time is not None:
                m.inter_token_times.append(now - seq.last_token_time)
            seq.last_token_time = now
            reason = self._check_finish(seq, tok)
            if reason is not None:
                seq.finish_reason = reason
                self.scheduler.finish(seq)
            text = seq.detok.take_delta(reason is not None)
            lp = None
            if logprobs is not None and logprobs[row] is not None:
                # a closing EOS or special stop token has no text in the output: no entry either
                lp = [] if reason == "stop" and tok in self._silent_ids else [logprobs[row]]
            deltas.setdefault(req.request_id, []).append(
                CompletionDelta(seq.index, text, [tok], reason, seq.num_output_tokens, lp)
            )
        self.num_generated_tokens += generated
        outputs = []
        for rid, ds in deltas.items():
            req = self.requests[rid]
            if req.is_finished:
                req.metrics.finished_time = now
                del self.requests[rid]
                if req.params.logprobs is not None:
                    self._with_logprobs -= 1
            prompt_logprobs = None
            if req.scores_prompt:  # its prompt is computed (a token was sampled): with its first output
                prompt_logprobs = req.prompt_logprobs or [None] * req.num_prompt_tokens
                req.prompt_logprobs, req.prompt_logprobs_sent = None, True
            outputs.append(self._output(req, ds, prompt_logprobs))
        return outputs

    def _check_finish(self, seq: Sequence, tok: int) -> str | None:
        p = seq.params
        closed = seq.json_state is not None and self.json.advance(seq, tok)
        # an optional grammar's JSON (a tool call under "auto") is not cut by a stop string or
        # token: they apply to a text answer (found by review: a stop cut a call's arguments)
        in_call = p.json_optional and seq.json_state is not None and seq.json_state is not OPEN
        can_stop = seq.num_output_tokens >= p.min_tokens and not in_call
        hit_stop_string = seq.detok.add_token(tok, check_stop=can_stop)
        if closed:
            return "stop"  # the object closed
        if can_stop and (
            hit_stop_string or tok in p.stop_token_ids or (not p.ignore_eos and tok in self.eos_token_ids)
        ):
            return "stop"
        if seq.num_output_tokens >= p.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def _output(self, req: Request, deltas: list[CompletionDelta], prompt_logprobs: list | None = None,
                ) -> RequestOutput:
        return RequestOutput(
            request_id=req.request_id, deltas=deltas, prompt_tokens=req.num_prompt_tokens,
            cached_prompt_tokens=req.cached_prompt_tokens, finished=req.is_finished, metrics=req.metrics,
            prompt_logprobs=prompt_logprobs,
        )

    # ---- measurements and conveniences --------------------------------------------------
    def stats(self) -> EngineStats:
        kv = self.kv
        return EngineStats(
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            kv_blocks_total=kv.pool.num_blocks,
            kv_blocks_used=kv.num_used_blocks,
            kv_usage=kv.usage,
            kv_utilization=kv.utilization() if kv.num_used_blocks else 0.0,  # idle: nothing held, not "full"
            prefix_hit_rate=kv.prefix_hit_rate,
            preemptions=self.scheduler.num_preemptions,
            steps=self.num_steps,
            generated_tokens=self.num_generated_tokens,
        )

    def generate(
        self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams],
    ) -> list[list[int]] | list[list[list[int]]]:
        """Offline batch: run every prompt together to the end; returns, in prompt order, the
        completion token ids of each prompt when every ``n == 1``, else (any ``n > 1``) each
        prompt's list of choices, by choice index: ``out[prompt][choice] -> token ids``."""
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        reqs = []
        try:
            for prompt, p in zip(prompts, params, strict=True):
                rid = f"offline-{next(self._ids)}"
                self.add_request(rid, prompt, p)
                reqs.append(self.requests[RequestId(rid)])
        except Exception:  # (found by QA: those added before the refused one ran at the next call)
            gone = {r.request_id for r in reqs}
            for rid in gone:
                self.abort_request(rid)
            self._abort_outputs = [o for o in self._abort_outputs if o.request_id not in gone]  # (no one asked)
            raise
        while any(not r.is_finished for r in reqs):
            self.step()
        if all(p.n == 1 for p in params):
            return [r.sequences[0].output_token_ids for r in reqs]
        return [[s.output_token_ids for s in sorted(r.sequences, key=lambda s: s.index)] for r in reqs]
