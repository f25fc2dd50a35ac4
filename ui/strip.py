"""The token strip as a small bidirectional component (``st.components.v2``, no build step).

The generated tokens are ``.semviz-strip .tok`` elements, in order, in the page's own DOM
(``isolate_styles=False``), so a browser test or a user style sheet reaches them. Each token
is coloured on an explicit scale (probability and entropy use different hues), is focusable,
and shows a card with its top alternatives and their probability after every stage of the
chain. Clicking a token selects its step (trigger ``select``); clicking an alternative in the
card branches from that step with it (trigger ``branch``, ``{"step", "id"}``). From the first
step the what-if sliders change on, the strip shows two lanes: the recorded tokens and the
counterfactual continuation as ghost text (``.semviz-strip .ghost``).

Hovering a generated token lights up the context tokens it read, by attention weight (the
mean over layers and heads of the step's recorded last-query attention, its top
:data:`LINKS` keys). This is plain CSS, so it answers in the browser with no rerun and no
script per hover: every token carries the class ``p<position>`` and the custom property
``--lit: var(--a<position>, 0)``; :func:`attention_css` writes one rule per hovered token
that sets ``--a<position>`` on the strip for the tokens it read, and the strip's style sheet
paints ``--lit`` as a background while any such token is hovered.

The payload is built by :func:`payload` (plain JSON; token text is set with ``textContent``
in the browser, never as HTML).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import streamlit as st
import torch

from semviz.gravity.masses import mean_attention
from semviz.output import style

MAX_TOKENS_SHOWN = 1500
ALTERNATIVES = 6  # rows in the hover card
PROMPT_CHARS = 240
LINKS = 8  # context tokens lit per hovered token: bounds the rules at LINKS per token shown


def _rgb(color: str) -> list[int]:
    """``rgb(r, g, b)`` (``style.shade``) as three ints."""
    return [int(float(x)) for x in color[color.index("(") + 1 : color.index(")")].split(",")]


# Each scale is the palette's (``style.PROBABILITY_SCALE``, ``style.ENTROPY_SCALE``): its mid
# tone, taken 15% toward the page's own background and painted with an opacity that grows
# with the value. A light page thus gets light chips and a dark page darker ones, so the chip
# stands out from the page and the theme's text reads on it in either theme.
CHIP_SHADE = 0.7
SCALES = {
    "probability": {
        "rgb": _rgb(style.shade(CHIP_SHADE, style.PROBABILITY_SCALE)),  # stronger = less likely
        "lo": "p = 1",
        "hi": "p ≤ 0.001 (a third of the bar per factor 10)",
        "title": "chosen token's probability",
    },
    "entropy": {
        "rgb": _rgb(style.shade(CHIP_SHADE, style.ENTROPY_SCALE)),  # stronger = more uncertain
        "lo": "H = 0",
        "hi": "H = {hmax:.1f} nats (the run's highest)",
        "title": "entropy of the step (nats)",
    },
}

GREY = style.REFERENCE
# the lit context tokens take the attention charts' scale, at a middle that reads on a light
# and on a dark page
ATTENTION = style.ATTENTION_SCALE
ATTENDED = _rgb(style.shade(0.6, ATTENTION))


def css() -> str:
    """The strip's style sheet: theme colours from Streamlit's ``--st-*`` variables (with the
    system colours as fallbacks), marks from the palette: the selected step in the focus
    yellow, the first what-if step and the ghost text in the what-if pink."""
    focus, whatif = style.FOCUS, style.WHATIF
    line, faint = style.rgba(GREY, 0.45), style.rgba(GREY, 0.35)
    lit = ", ".join(str(c) for c in ATTENDED)
    return f"""
.semviz-strip-root {{ font-size: 14px; }}
.semviz-strip {{
  font-family: ui-monospace, SFMono-Regular, Menlo, monospace; line-height: 2.0;
  white-space: pre-wrap; word-break: break-word; max-height: 340px; overflow-y: auto;
  border: 1px solid var(--st-border-color, {faint}); border-radius: 8px;
  padding: 8px 10px; color: var(--st-text-color, CanvasText);
  background: var(--st-background-color, transparent);
}}
.semviz-strip .prompt, .semviz-strip .ptok {{ opacity: .55; }}
.semviz-strip, .semviz-legend {{
  --tok-strong: color-mix(in srgb, var(--tok-hue) 85%, var(--st-background-color, Canvas));
}}
.semviz-strip:has(.tok.att:hover) .tok, .semviz-strip:has(.tok.att:hover) .ptok {{
  background-color: rgba({lit}, calc(var(--lit, 0) * .85)) !important; }}
.semviz-strip:has(.tok.att:hover) .ptok {{ opacity: calc(.55 + .45 * var(--lit, 0)); }}
.semviz-strip .tok, .semviz-strip .ghost {{
  border-radius: 3px; padding: 1px 1px; margin-right: 1px; cursor: pointer;
  box-shadow: inset 0 -1px 0 {line};
}}
.semviz-strip .tok {{
  background: color-mix(in srgb, var(--tok-strong) calc(var(--v, 0) * 85%), transparent);
}}
.semviz-strip .tok:hover, .semviz-strip .tok:focus {{
  outline: 1px solid currentColor; outline-offset: 0; }}
.semviz-strip .tok.sel {{ box-shadow: 0 0 0 3px {focus}; }}
.semviz-strip .tok.changed {{ opacity: .6; }}
.semviz-strip .tok.first {{ box-shadow: inset 0 -3px 0 {whatif}; }}
.semviz-strip .tok.sel.first {{ box-shadow: 0 0 0 3px {focus}, inset 0 -3px 0 {whatif}; }}
.semviz-strip .lanes {{ display: block; margin: 6px 0 2px;
  border-left: 3px solid {whatif}; padding-left: 8px; }}
.semviz-strip .lane {{ display: block; }}
.semviz-strip .lane-label {{
  display: inline-block; min-width: 5.5em; font-family: var(--st-font, sans-serif);
  font-size: 11px; text-transform: uppercase; letter-spacing: .04em; opacity: .7; }}
.semviz-strip .ghost {{
  font-style: italic; opacity: .85; cursor: default;
  box-shadow: none; border-bottom: 2px dashed {whatif}; border-radius: 0; }}
.semviz-strip .pending {{ opacity: .6; font-style: italic; }}
.semviz-legend {{ display: flex; flex-wrap: wrap; gap: 6px 14px; align-items: center;
  font-size: 12px; opacity: .85; margin-top: 6px; font-family: var(--st-font, sans-serif); }}
.semviz-legend .bar {{ display: inline-block; width: 140px; height: 10px; border-radius: 3px;
  vertical-align: middle; margin: 0 6px; border: 1px solid {style.rgba(GREY, 0.4)};
  background: linear-gradient(90deg, transparent,
    color-mix(in srgb, var(--tok-strong) 85%, transparent)); }}
.semviz-legend .mark {{ display: inline-block; width: 14px; height: 10px; border-radius: 2px;
  vertical-align: middle; margin-right: 4px; }}
.semviz-card {{
  position: fixed; z-index: 1000; max-width: 460px; min-width: 280px; padding: 8px 10px;
  border-radius: 8px; font-size: 12px; line-height: 1.45;
  font-family: var(--st-font, sans-serif);
  color: var(--st-text-color, CanvasText); background: var(--st-background-color, Canvas);
  border: 1px solid var(--st-border-color, {style.rgba(GREY, 0.5)});
  box-shadow: 0 6px 24px {style.rgba(GREY, 0.45)};
}}
.semviz-card .head {{ font-weight: 600; margin-bottom: 4px; }}
.semviz-card .filters {{ font-size: 0.92em; opacity: 0.8; margin-bottom: 4px; }}
.semviz-card table {{ border-collapse: collapse; width: 100%; }}
.semviz-card th {{ font-weight: 500; opacity: .7; text-align: right; padding: 1px 5px; }}
.semviz-card td {{ text-align: right; padding: 1px 5px; font-variant-numeric: tabular-nums; }}
.semviz-card td.t, .semviz-card th.t {{ text-align: left; font-family: ui-monospace, monospace;
  white-space: pre; max-width: 140px; overflow: hidden; text-overflow: ellipsis; }}
.semviz-card tr.alt {{ cursor: pointer; }}
.semviz-card tr.alt:hover, .semviz-card tr.alt:focus {{
  background: var(--st-secondary-background-color, {style.rgba(GREY, 0.15)}); outline: none; }}
.semviz-card tr.taken td {{ font-weight: 600; }}
.semviz-card .hint {{ opacity: .7; margin-top: 4px; }}
"""


JS = r"""
const show = (t) => (t === "" ? "∅" : t.replace(/\n/g, "↵\n"));
const fmt = (p) => (p === null || p === undefined || Number.isNaN(p) ? "–"
  : p >= 0.995 ? p.toFixed(2) : p < 0.001 ? (p > 0 ? "<.001" : "0") : p.toFixed(3));

function lit(s, pos) {
  s.classList.add("p" + pos);
  s.style.setProperty("--lit", `var(--a${pos}, 0)`);
}

function tokSpan(d, t, extra) {
  const [step, text, v, pos, att] = t;
  const s = document.createElement("span");
  s.className = "tok" + (extra || "") + (step === d.selected ? " sel" : "") + (att ? " att" : "");
  lit(s, pos);
  s.dataset.step = step;
  s.tabIndex = 0;
  s.textContent = show(text);
  s.style.setProperty("--v", Math.max(0, Math.min(1, v)).toFixed(3));  // the colour: css()
  return s;
}

function render(root, d) {
  root.style.setProperty("--tok-hue", `rgb(${d.rgb.join(",")})`);
  const old = root.querySelector(".semviz-strip");
  const keep = old ? old.scrollTop : null;
  const atEnd = old ? old.scrollTop + old.clientHeight >= old.scrollHeight - 4 : true;
  const box = document.createElement("div");
  box.className = "semviz-strip";
  box.setAttribute("role", "group");
  box.setAttribute("aria-label", "generated tokens; click one to select its step");
  if (d.prompt_cut) {
    const cut = document.createElement("span");
    cut.className = "prompt";
    cut.textContent = "…";
    box.appendChild(cut);
  }
  for (const [pos, text] of d.prompt) {
    const p = document.createElement("span");
    p.className = "ptok";
    lit(p, pos);
    p.textContent = text;
    box.appendChild(p);
  }
  if (d.skipped) {
    const sk = document.createElement("span");
    sk.className = "prompt";
    sk.textContent = ` … ${d.skipped} earlier tokens … `;
    box.appendChild(sk);
  }
  const k = d.first_diff;
  let lanes = null, recLane = null;
  for (const t of d.tokens) {
    const step = t[0];
    if (k !== null && step === k) {
      lanes = document.createElement("span");
      lanes.className = "lanes";
      recLane = document.createElement("span");
      recLane.className = "lane rec";
      const lab = document.createElement("span");
      lab.className = "lane-label";
      lab.textContent = "recorded";
      recLane.appendChild(lab);
      lanes.appendChild(recLane);
      box.appendChild(lanes);
    }
    const changed = k !== null && step >= k;
    const el = tokSpan(d, t, changed ? (step === k ? " changed first" : " changed") : "");
    (recLane || box).appendChild(el);
  }
  if (lanes && d.ghost) {
    const g = document.createElement("span");
    g.className = "lane ghost-lane";
    const lab = document.createElement("span");
    lab.className = "lane-label";
    lab.textContent = "what-if";
    g.appendChild(lab);
    d.ghost.tokens.forEach((text, j) => {
      const s = document.createElement("span");
      s.className = "ghost";
      s.dataset.step = k + j;
      s.textContent = show(text);
      g.appendChild(s);
    });
    if (d.ghost.note) {
      const p = document.createElement("span");
      p.className = "pending";
      p.textContent = " " + d.ghost.note;
      g.appendChild(p);
    }
    lanes.appendChild(g);
  }
  if (old) old.replaceWith(box); else root.prepend(box);
  let rules = root.querySelector("style.semviz-attn");
  if (!rules) { rules = document.createElement("style"); rules.className = "semviz-attn"; root.appendChild(rules); }
  if (rules.textContent !== d.attn_css) rules.textContent = d.attn_css;
  if (d.follow && atEnd) box.scrollTop = box.scrollHeight;
  else if (keep !== null) box.scrollTop = keep;
  const sel = box.querySelector(".tok.sel");
  if (sel && !d.follow) {
    const b = box.getBoundingClientRect(), r = sel.getBoundingClientRect();
    if (r.top < b.top || r.bottom > b.bottom) box.scrollTop += r.top - b.top - b.height / 3;
  }
  legend(root, d);
}

function legend(root, d) {
  let lg = root.querySelector(".semviz-legend");
  if (!lg) { lg = document.createElement("div"); lg.className = "semviz-legend"; root.appendChild(lg); }
  lg.replaceChildren();
  const sc = document.createElement("span");
  sc.append(d.scale.title + ": " + d.scale.lo);
  const bar = document.createElement("span");
  bar.className = "bar";
  sc.append(bar, d.scale.hi);
  lg.appendChild(sc);
  for (const [text, mark] of d.hints) {
    const h = document.createElement("span");
    if (mark) { const m = document.createElement("span"); m.className = "mark"; m.style.background = mark; h.appendChild(m); }
    h.append(text);
    lg.appendChild(h);
  }
}

function card(root, step, anchor) {
  const d = root.__d;
  const alts = d.alts[String(step)];
  hide(root);
  if (!alts) return;
  const c = document.createElement("div");
  c.className = "semviz-card";
  c.dataset.step = step;
  const head = document.createElement("div");
  head.className = "head";
  head.textContent = alts.head;
  c.appendChild(head);
  if (alts.filters) {
    const f = document.createElement("div");
    f.className = "filters";
    f.textContent = "filters: " + alts.filters;
    c.appendChild(f);
  }
  const tb = document.createElement("table");
  const hr = document.createElement("tr");
  for (const h of ["token", ...alts.stages]) {
    const th = document.createElement("th");
    th.textContent = h;
    if (h === "token") th.className = "t";
    hr.appendChild(th);
  }
  tb.appendChild(hr);
  for (const [id, text, probs, taken] of alts.rows) {
    const tr = document.createElement("tr");
    tr.className = taken ? "taken" : "alt";
    const td = document.createElement("td");
    td.className = "t";
    td.textContent = (taken ? "▶ " : "") + text;
    tr.appendChild(td);
    for (const p of probs) { const x = document.createElement("td"); x.textContent = fmt(p); tr.appendChild(x); }
    if (!taken && d.branchable) {
      tr.tabIndex = 0;
      tr.title = "branch: take this token at step " + step + " and decode on";
      const go = () => { hide(root); root.__trigger("branch", { step: step, id: id }); };
      tr.addEventListener("click", go);
      tr.addEventListener("keydown", (e) => { if (e.key === "Enter") go(); });
    }
    tb.appendChild(tr);
  }
  c.appendChild(tb);
  const hint = document.createElement("div");
  hint.className = "hint";
  hint.textContent = d.branchable ? "Click a row to branch from this step with that token."
    : alts.why || "";
  c.appendChild(hint);
  c.addEventListener("mouseenter", () => clearTimeout(root.__hideT));
  c.addEventListener("mouseleave", () => later(root));
  root.appendChild(c);
  const r = anchor.getBoundingClientRect();
  const w = c.offsetWidth, h = c.offsetHeight;
  let x = Math.min(r.left, window.innerWidth - w - 8), y = r.bottom + 4;
  if (y + h > window.innerHeight - 8) y = Math.max(8, r.top - h - 4);
  c.style.left = Math.max(8, x) + "px";
  c.style.top = y + "px";
}

function hide(root) { clearTimeout(root.__hideT); root.querySelectorAll(".semviz-card").forEach((c) => c.remove()); }
function later(root) { clearTimeout(root.__hideT); root.__hideT = setTimeout(() => hide(root), 300); }

function wire(root) {
  if (root.__wired) return;
  root.__wired = true;
  const tokOf = (e) => e.target.closest && e.target.closest(".semviz-strip .tok");
  root.addEventListener("mouseover", (e) => {
    const t = tokOf(e);
    if (!t) return;
    clearTimeout(root.__hideT);
    const cur = root.querySelector(".semviz-card");
    if (cur && cur.dataset.step === t.dataset.step) return;
    card(root, Number(t.dataset.step), t);
  });
  root.addEventListener("mouseout", (e) => { if (tokOf(e)) later(root); });
  root.addEventListener("focusin", (e) => { const t = tokOf(e); if (t) card(root, Number(t.dataset.step), t); });
  root.addEventListener("click", (e) => {
    const t = tokOf(e);
    if (t) root.__trigger("select", Number(t.dataset.step));
  });
  root.addEventListener("keydown", (e) => {
    const t = tokOf(e);
    if (t && (e.key === "Enter" || e.key === " ")) { e.preventDefault(); root.__trigger("select", Number(t.dataset.step)); }
    if (e.key === "Escape") hide(root);
  });
}

export default function (component) {
  const { data, setTriggerValue, parentElement } = component;
  let root = parentElement.querySelector(".semviz-strip-root");
  if (!root) {
    root = document.createElement("div");
    root.className = "semviz-strip-root";
    parentElement.appendChild(root);
  }
  root.__d = data;
  root.__trigger = setTriggerValue;
  wire(root);
  const open = root.querySelector(".semviz-card");
  render(root, data);
  if (open) {
    const t = root.querySelector(`.semviz-strip .tok[data-step="${open.dataset.step}"]`);
    if (t && t.matches(":hover")) card(root, Number(open.dataset.step), t); else hide(root);
  }
  return () => hide(root);
}
"""

_COMPONENT: Any = None


def _component():
    global _COMPONENT
    if _COMPONENT is None:
        _COMPONENT = st.components.v2.component(
            "semviz_token_strip", css=css(), js=JS, isolate_styles=False
        )
    return _COMPONENT


def value(p: float) -> float:
    """Colour intensity for a chosen-token probability, on a log scale: 0 at p = 1, 1/3 at
    0.1, 2/3 at 0.01, 1 at 0.001 and below (a linear scale paints most sampled tokens dark)."""
    if not math.isfinite(p) or p <= 0.0:
        return 1.0
    return min(1.0, max(0.0, -math.log10(p) / 3.0))


def read_label(layers: Sequence[int] = (), heads: Sequence[int] = ()) -> str:
    """What the hover's attention averages: "the mean over layers and heads", "layer 3,
    head 2", "layers 1, 4, the mean over heads"."""

    def part(what: str, pick: Sequence[int]) -> str | None:
        if not pick:
            return None
        return f"{what}{'s' if len(pick) > 1 else ''} {', '.join(str(j) for j in sorted(pick))}"

    bits = [part("layer", layers), part("head", heads)]
    if not any(bits):
        return "the mean over layers and heads"
    rest = "the mean over layers" if not layers else "the mean over heads" if not heads else ""
    return ", ".join(b for b in (*bits, rest) if b)


def payload(
    ctx,
    color_by: str = "probability",
    *,
    ghost: dict | None = None,
    branchable: bool = True,
    layers: Sequence[int] = (),
    heads: Sequence[int] = (),
) -> dict:
    """The strip's data for ``ctx``'s run: tokens, colours, hover cards and the ghost lane.

    A hovered token lights what it read by its attention averaged over ``layers`` and
    ``heads`` (empty: all; the Attention page passes its choice)."""
    tr = ctx.trace
    steps = tr.steps
    n = len(steps)
    start = max(0, n - MAX_TOKENS_SHOWN)
    scale = dict(SCALES.get(color_by, SCALES["probability"]))
    hmax = max((s.entropy for s in steps), default=1.0) or 1.0
    scale["hi"] = scale["hi"].format(hmax=hmax)
    tokens, alts = [], {}
    stages = list(steps[0].stage_probs) if steps else []
    first = ctx.first_diff
    whatif = first is not None
    cards = _cards(ctx.sess.strip_cards, start, n)
    # the chat template's markers as every other view shows them (⟨im_start⟩), so they read as
    # tokens the model was given rather than as text someone typed; the prompt's last tokens
    # up to PROMPT_CHARS, each its own span so that attention can light it
    prompt: list[list] = []
    chars = 0
    for pos in range(len(tr.prompt_tokens) - 1, -1, -1):
        text = style.mark_specials(
            style.piece_text(tr.prompt_tokens[pos], tr.prompt_hex.get(str(pos)))
        )
        if prompt and chars + len(text) > PROMPT_CHARS:
            break
        prompt.append([pos, text])
        chars += len(text)
    prompt.reverse()
    shown_from = prompt[0][0] if prompt else len(tr.prompt_tokens)
    read = []
    for i in range(start, n):
        s = steps[i]
        v = s.entropy / hmax if color_by == "entropy" else value(s.chosen_prob)
        res = ctx.result(i) if whatif else None
        hit = cards.get(i)
        # an entry is (record, what-if result, whatif, stages, card, links); one of another
        # shape, or for another record or result, is made again
        stale = hit is None or len(hit) != 6 or hit[0] is not s or hit[1] is not res
        if stale or hit[2:4] != (whatif, stages):
            card = _card(ctx, i, stages, whatif, res)
            hit = cards[i] = (s, res, whatif, stages, card, links(s))
        alts[str(i)] = hit[4]
        # the cards keep the mean over everything; a choice of layers or heads is read afresh
        read_from = hit[5] if not (layers or heads) else links(s, layers=layers, heads=heads)
        # only links to tokens on show: a rule for a hidden token would light nothing
        shown = [(p, w) for p, w in read_from if p >= shown_from]
        text = style.piece_text(s.token_text, s.token_hex)  # a piece of a character: its bytes
        tokens.append([i, text, round(float(v), 3), int(s.position), bool(shown)])
        read.append((int(s.position), shown))
    # [text, colour of its mark or None]
    hints = [["selected step (click a token)", style.FOCUS], ["hover: alternatives", None]]
    if any(t[4] for t in tokens):
        what = "" if not (layers or heads) else f" ({read_label(layers, heads)})"
        hints.append(
            [f"hover: the tokens it read, by attention{what}", style.shade(0.6, ATTENTION)]
        )
    if whatif:
        hints.append(
            [f"the sliders change step {first}; below it, what-if ghost text", style.WHATIF]
        )
    return {
        "prompt": prompt,
        "prompt_cut": shown_from > 0,
        "skipped": start,
        "tokens": tokens,
        "selected": ctx.selected,
        "follow": ctx.sess.selected is None,
        "first_diff": first,
        "ghost": ghost,
        "rgb": scale.pop("rgb"),
        "scale": scale,
        "alts": alts,
        "hints": hints,
        "branchable": branchable,
        "attn_css": attention_css(read),
    }


def links(
    rec, k: int = LINKS, *, layers: Sequence[int] = (), heads: Sequence[int] = ()
) -> list[tuple[int, float]]:
    """The ``k`` context positions step ``rec`` read most, with their weights, heaviest first:
    its recorded last-query attention ``(L, H, S)`` averaged over ``layers`` and ``heads``
    (empty: all of them), over the keys at ``rec.cache_positions``. A step recorded without
    attention reads nothing here; indices past the record's layers or heads are ignored."""
    att = getattr(rec, "attention", None)
    if att is None or att.numel() == 0:
        return []
    L, H = att.shape[:2]
    lay = tuple(int(j) for j in layers if 0 <= int(j) < L) or None
    hd = tuple(int(j) for j in heads if 0 <= int(j) < H) or None
    w = mean_attention(att, lay, hd)
    top = torch.topk(w, min(k, w.numel()))
    pos = rec.cache_positions
    return [(int(pos[j]), float(v)) for v, j in zip(top.values, top.indices, strict=True)]


def attention_css(read: list[tuple[int, list[tuple[int, float]]]]) -> str:
    """One rule per hovered token: ``read`` holds ``(position, links)`` (:func:`links`). While
    the token at ``position`` is hovered, each position it read gets ``--a<position>``, its
    weight over the row's heaviest, so the heaviest link is fully lit whatever the row's
    spread (a mean over heads rarely tops 0.5) and the rest scale with their weight. Links of
    weight 0 set nothing."""
    rules = []
    for q, row in read:
        top = max((w for _, w in row), default=0.0)
        if top <= 0.0:
            continue
        decls = ";".join(f"--a{p}:{w / top:.3f}" for p, w in row if w > 0.0)
        rules.append(f".semviz-strip:has(.p{q}:hover){{{decls}}}")
    return "\n".join(rules)


def _cards(cards: dict, start: int, n: int) -> dict:
    """The session's hover cards by step (``SessionData.strip_cards``), kept between draws: a
    run that plays on redraws its strip every tick, and a card changes only with its step's
    record or what-if result. Steps outside ``start:n`` are dropped."""
    if len(cards) > n - start:
        for i in [i for i in cards if not start <= i < n]:
            del cards[i]
    return cards


def _card(ctx, i: int, stages: list[str], whatif: bool, res) -> dict:
    """Step ``i``'s hover card; with a what-if column when ``whatif``, from ``res`` (the
    step's what-if result; None leaves the column empty)."""
    rec = ctx.steps[i]
    k = min(ALTERNATIVES, rec.cand_ids.numel())
    ids = rec.cand_ids[:k].tolist()
    rows_ids = ids if rec.chosen_rank < 0 or rec.chosen_rank < k else [*ids, rec.token_id]
    ranks = list(range(k)) if len(rows_ids) == k else [*range(k), rec.chosen_rank]
    labels = [style.display_token(t) for t in ctx.labels(rows_ids)]  # whitespace shows
    # a stage that changed nothing at this step (gravity at λ 0, T 1) is left out of the card
    shown = [
        name
        for j, name in enumerate(stages)
        if j == 0
        or name == "final"
        or not torch.equal(rec.stage_probs[name], rec.stage_probs[stages[j - 1]])
    ]
    raw = rec.top_probs
    rows = []
    for r, tid, lab in zip(ranks, rows_ids, labels, strict=True):
        probs = []
        for name in shown:
            if name == "raw" and r < raw.numel():
                probs.append(round(float(raw[r]), 4))
            else:
                probs.append(round(float(rec.stage_probs[name][r]), 4))
        if whatif:
            probs.append(round(float(res.index_probs["final"][r]), 4) if res is not None else None)
        rows.append([int(tid), lab, probs, r == rec.chosen_rank])
    p = rec.chosen_prob
    head = (
        f"step {i} · {style.step_token(rec)} · p {p:.3f} · H {rec.entropy:.2f} nats · "
        f"kept {rec.n_kept} · T {rec.temperature:.2f}"
    )
    # each filter stage of the chain: what it left and the share of the mass it removed (of
    # what entered it); the table's "final" column is after all of them. A replay's first
    # stage, the recorded candidates themselves, is not a filter of the chain.
    wf = [w.to_dict() for w in res.waterfall] if whatif and res is not None else rec.waterfall
    filters = (
        " · ".join(
            f"{w['name']} → {int(w['n_kept']):,} left, −{100 * float(w['mass_removed']):.1f}%"
            for w in wf
            if w["name"] != "candidates"
        )
        or "no filter on"
    )
    return {
        "head": head,
        "filters": filters,
        "rows": rows,
        "stages": [*shown, "what-if"] if whatif else shown,
    }


def draw(
    ctx,
    color_by: str = "probability",
    *,
    ghost: dict | None = None,
    branchable: bool = True,
    on_select: Callable[[int], None] | None = None,
    on_branch: Callable[[int, int], None] | None = None,
    key: str = "semviz_strip",
    layers: Sequence[int] = (),
    heads: Sequence[int] = (),
) -> None:
    """Mount the strip; ``on_select(step)`` and ``on_branch(step, token_id)`` run as callbacks.
    The hover's attention is averaged over ``layers`` and ``heads`` (empty: all)."""

    def _sel() -> None:
        v = _trigger(key, "select")
        if v is not None and on_select is not None:
            on_select(int(v))

    def _br() -> None:
        v = _trigger(key, "branch")
        if isinstance(v, dict) and on_branch is not None:
            on_branch(int(v["step"]), int(v["id"]))

    data = payload(
        ctx,
        color_by,
        ghost=ghost,
        branchable=branchable and on_branch is not None,
        layers=layers,
        heads=heads,
    )
    _component()(key=key, data=data, on_select_change=_sel, on_branch_change=_br)


def _trigger(key: str, name: str):
    state = st.session_state.get(key)
    if state is None:
        return None
    return state.get(name) if isinstance(state, dict) else getattr(state, name, None)
