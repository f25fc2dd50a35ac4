"""The shipped examples (data/examples) are what their commands in data/README.md make today:
a changed default (a gravity kind, a filter) makes the app label an example with settings it
was not recorded with, so this fails until the examples are recorded again."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from semviz.cli import build_parser, common
from semviz.output.trace import FORMAT_VERSION, Trace
from semviz.sampling import PruneParams

ROOT = Path(__file__).resolve().parents[2]


def _commands() -> list[list[str]]:
    text = (ROOT / "data" / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## examples/.*?```bash\n(.*?)```", text, re.S).group(1)
    lines = block.replace("\\\n", " ").splitlines()
    return [shlex.split(line)[3:] for line in lines if line.startswith("python -m semviz trace")]


COMMANDS = _commands()


def test_every_example_has_a_command():
    outs = sorted(Path(argv[argv.index("--out") + 1]).name for argv in COMMANDS)
    assert outs == sorted(p.name for p in (ROOT / "data" / "examples").glob("*.json"))


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: Path(a[a.index("--out") + 1]).stem)
def test_an_example_holds_what_its_command_makes_today(argv):
    args = build_parser().parse_args(argv)
    t = Trace.load(ROOT / args.out)
    assert t.prompt == args.prompt
    s = t.settings
    assert (s["seed"], s["chat"], s["record_k"]) == (args.seed, args.chat, args.record_k)
    assert s["capture"] is (args.attention == "on") and s["capture"]
    assert s.get("lens") is (args.lens == "on")  # the lens is left out to keep the files small
    assert all(rec.attention is not None for rec in t.steps)  # Attention & gravity has data
    assert PruneParams.from_dict(s["params"]) == common.params_from_args(args)
    # left out to keep the files small: replay marks what the candidates cannot decide
    assert s.get("full_logits", False) is (args.full_logits == "on") is False
    assert all(rec.full_logits is None for rec in t.steps)
    # format 3: each step has the tail summary the what-if needs; 4 adds only full_logits
    assert t.steps and all(rec.tail is not None for rec in t.steps)
    assert FORMAT_VERSION == 4


def test_the_story_example_is_tour_step_4s_gravity():
    """Its title promises narrative gravity and its blurb tour step 4: it is recorded at
    exactly the sliders tour step 4 sets, the pull whose terms Attention & gravity draws."""
    from ui import examples, tour

    t = Trace.load(ROOT / "data" / "examples" / "story_gravity.json")
    assert PruneParams.from_dict(t.settings["params"]) == tour.GRAVITY
    assert tour.GRAVITY.gravity_kind == "pull" and tour.GRAVITY.gravity_lambda > 0
    blurb = {e.name: e.blurb for e in examples.available()}["story_gravity.json"]
    assert "tour step 4" in blurb and "pull" in blurb
