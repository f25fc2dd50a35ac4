"""Example runs shipped in ``data/examples/``: recorded traces that open without a model.

``data/README.md`` gives the exact command that made each one. The titles below are what the
front door shows; any other trace dropped into the folder is listed under its file name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the front door lists the examples without importing torch
    from semviz.output.trace import Trace

FOLDER = Path(__file__).resolve().parents[1] / "data" / "examples"

BLURBS = {
    "sea.json": (
        "The sea, at the app's defaults",
        "Plain sampling at T 0.8 up to the end of text (59 tokens): the run Step makes "
        "with the defaults. Move the temperature slider to see where it would have gone.",
    ),
    "story_gravity.json": (
        "A story with narrative gravity",
        "T 0.8, top-k 50, top-p 0.95 with the seed's gravity, the attention-weighted pull, as a "
        "rerank at λ 0.5 (tour step 4): Attention & gravity shows what pulled each token.",
    ),
    "capital_attention.json": (
        "A short fact, with attention",
        "16 tokens with every step's attention recorded: open Attention & gravity.",
    ),
}


@dataclass(frozen=True)
class Example:
    name: str  # file name in data/examples
    title: str
    blurb: str

    @property
    def path(self) -> Path:
        return FOLDER / self.name


def available() -> list[Example]:
    """The examples on disk, the described ones first."""
    files = sorted(FOLDER.glob("*.json")) if FOLDER.is_dir() else []
    out = []
    for f in sorted(
        files,
        key=lambda f: (
            f.name not in BLURBS,
            list(BLURBS).index(f.name) if f.name in BLURBS else 0,
            f.name,
        ),
    ):
        title, blurb = BLURBS.get(f.name, (f.stem.replace("_", " "), ""))
        out.append(Example(f.name, title, blurb))
    return out


def load(name: str) -> Trace:
    """The example trace ``name`` (a file name from :func:`available`); ``TraceError`` if not
    readable. Parsed afresh each time, so a session never shares a trace with another."""
    from semviz.output.trace import Trace

    if "/" in name or "\\" in name or not name.endswith(".json"):
        raise ValueError(f"{name!r} is not an example name.")
    return Trace.load(FOLDER / name)
