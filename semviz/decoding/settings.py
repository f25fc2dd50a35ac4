"""What a run is besides its sampling parameters, declared once: the model, the chat template,
the seed, how many tokens, the KV policy and its budget.

Each field is declared with ``setting()``, as the sampling fields of
:class:`~semviz.sampling.PruneParams` are: its type, range, help and label live in the
field's :class:`~semviz.sampling.FieldSpec`, and the CLI's flags
(:func:`semviz.cli.common.add_run_args`) and the app's controls read them from there, so a
range is the same everywhere.

The seed is a 31-bit non-negative integer (``SEED_MAX``): every consumer holds it exactly
(torch, numpy's legacy seeding, ``transformers.set_seed``, JSON in any language, the app's
number box), and a trace made by the CLI opens in the app with its seed.

Examples
--------
>>> run = RunSettings(seed=7, max_new_tokens=16)
>>> run.decode_settings().max_new_tokens, run.eviction() is None
(16, True)
>>> RunSettings(seed=-1)
Traceback (most recent call last):
...
ValueError: RunSettings.seed=-1: must be in [0, 2147483647]
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any

from semviz.decoding.decoder import DecodeSettings
from semviz.eviction import POLICIES
from semviz.eviction import make_policy as _make_policy
from semviz.model.load import model_key
from semviz.sampling.params import FieldSpec, setting

__all__ = ["KV_POLICIES", "MAX_STEPS", "RUN_SPECS", "SEED_MAX", "RunSettings"]

SEED_MAX = 2**31 - 1
MAX_STEPS = 8192
KV_POLICIES = ("none", *POLICIES)  # "none": the cache keeps every entry


@dataclass(frozen=True)
class RunSettings:
    """The settings of one run that are not sampling parameters (see the module docstring)."""

    model: str = setting(
        "",
        "Empty for the offline default; or a local model folder, a .gguf file, or a "
        "Hugging Face id (needs the hub).",
        label="Model",
    )
    chat: bool | None = setting(
        None,
        "Wrap the prompt in the model's chat template (auto: when the model has one).",
        kind="bool",
        optional=True,
        note="auto: when the model has one",
        label="Chat template",
        app_default=True,
    )
    seed: int = setting(
        0, "Seed of the run's sampler.", lo=0, hi=SEED_MAX, app=(0, SEED_MAX, 1), label="Seed"
    )
    max_new_tokens: int = setting(
        64,
        "Most new tokens the run generates.",
        lo=1,
        hi=MAX_STEPS,
        app=(1, MAX_STEPS, 16),
        label="Max new tokens",
        app_default=512,
        flag="--steps",
    )
    kv_policy: str = setting(
        "none",
        "KV-cache eviction policy; none keeps every entry.",
        choices=KV_POLICIES,
        app=True,
        label="KV policy",
    )
    kv_budget: int = setting(
        256,
        "Tokens per layer the KV cache keeps under a KV policy.",
        lo=8,
        hi=MAX_STEPS,
        app=(8, MAX_STEPS, 8),
        label="KV budget (tokens)",
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            why = f.metadata["spec"].problem(getattr(self, f.name))
            if why is not None:
                raise ValueError(f"RunSettings.{f.name}={getattr(self, f.name)!r}: {why}")

    def replace(self, **changes: Any) -> RunSettings:
        """A copy with ``changes``, validated (``ValueError`` names the field)."""
        return dataclasses.replace(self, **changes)

    def decode_settings(self, **kw: Any) -> DecodeSettings:
        """The decoder's :class:`DecodeSettings` for this run; ``kw`` sets the others (stop,
        record_k, capture, system_prompt)."""
        return DecodeSettings(
            seed=self.seed, max_new_tokens=self.max_new_tokens, chat=self.chat, **kw
        )

    def eviction(self):
        """A fresh eviction policy for one decoder, or None for ``"none"``."""
        if self.kv_policy == "none":
            return None
        return _make_policy(self.kv_policy, budget=self.kv_budget)

    def key(self) -> tuple:
        """What a decoder is built from (with the prompt): a change to any starts a new run."""
        budget = self.kv_budget if self.kv_policy != "none" else 0
        return (
            model_key(self.model),
            self.chat,
            self.seed,
            self.kv_policy,
            budget,
            self.max_new_tokens,
        )


RUN_SPECS: dict[str, FieldSpec] = {f.name: f.metadata["spec"] for f in fields(RunSettings)}
