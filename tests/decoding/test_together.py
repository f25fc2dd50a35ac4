"""Decoders fed as rows of one forward (sessions of one server, Compare's sides) step as they
do alone: the same logits and attention to float rounding, own caches without padding, and so
the same tokens wherever rounding cannot reorder the candidates a draw lands among.

The tiny random model's distribution over the whole vocabulary is nearly flat (its logits span
about 0.44 across 49,152 tokens), so many tokens' logits lie within rounding (up to 7.5e-8
here) of a neighbour's, and a batch's kernel shapes round them into another order: about 0.5%
of draws at temperature 1.0 over the whole vocabulary pick another token in a batch. Tests
that compare tokens draw from the top 40, where no two logits are that close.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from semviz import Decoder, DecodeSettings, PruneParams
from semviz.decoding.together import feed_together, step_together
from semviz.eviction import make_policy
from semviz.model.queue import ForwardQueue, Gather

PROMPTS = ["The sea", "Once upon a time there was a lighthouse keeper who", "Water boils at"]
SAME_LENGTH = ["The sea is", "Water boils at", "A cat sat"]  # 3 tokens each
# batches of PROMPTS' decoders (indices) as a gatherer made them in a run of the threaded test
# below: members and their order change from one forward to the next, pairs are padded
GATHERED = [
    [2],
    [1, 0],
    [2],
    [1],
    [0, 2],
    [1],
    [0, 2],
    [1],
    [2, 0],
    [1],
    [0],
    [2, 1],
    [0],
    [1],
    [2, 0],
    [1],
    [0],
    [2],
]
# batches of SAME_LENGTH's decoders, every one fed once a round: shared rows of three, then
# two and one, then three again, in another order
REGROUPED = [
    [0, 1, 2],
    [0, 1],
    [2],
    [0, 1, 2],
    [1, 2],
    [0],
    [0, 2],
    [1],
    [0, 1, 2],
    [2, 0, 1],
    [0, 1, 2],
]


def _decoders(lm, prompts=PROMPTS, **params) -> list[Decoder]:
    p = PruneParams(**params)
    return [
        Decoder(lm, text, p, DecodeSettings(seed=i, max_new_tokens=64, chat=False, capture=True))
        for i, text in enumerate(prompts)
    ]


def in_threads(session, decoders: list[Decoder]) -> list[BaseException]:
    """Run ``session(d)`` for every decoder, each in its own thread; the errors they raised."""
    errors: list[BaseException] = []

    def run(d: Decoder) -> None:
        try:
            session(d)
        except BaseException as e:  # noqa: BLE001 - returned to the test
            errors.append(e)

    threads = [threading.Thread(target=run, args=(d,)) for d in decoders]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return errors


@pytest.mark.parametrize(
    "params",
    [
        {"temperature": 0.9, "top_k": 40},
        {
            "temperature": 0.8,
            "gravity_lambda": 0.7,
            "gravity_kind": "pull",
            "gravity_mass": "attention",
        },
    ],
    ids=["plain", "attention-gravity"],
)
def test_rows_at_different_positions_step_as_they_do_alone(tiny_lm, params):
    alone, together = _decoders(tiny_lm, **params), _decoders(tiny_lm, **params)
    assert len({len(d.ids) for d in together}) == len(PROMPTS)  # padded rows
    for d in [*alone, *together]:
        d.step()  # the prefill's logits
    for _ in range(6):
        for d in alone:
            _feed_alone(d)
        assert feed_together(together) == len(PROMPTS)
        for a, b in zip(alone, together, strict=True):
            torch.testing.assert_close(b._pending.logits, a._pending.logits, rtol=0, atol=1e-5)
            a.step()
            b.step()
            ra, rb = a.trace.steps[-1], b.trace.steps[-1]
            assert rb.token_id == ra.token_id
            torch.testing.assert_close(
                rb.attention.float(), ra.attention.float(), atol=1e-3, rtol=0
            )
    for a, b in zip(alone, together, strict=True):
        assert b.ids == a.ids
        for la, lb in zip(a.cache.layers, b.cache.layers, strict=True):
            assert lb.keys.shape == la.keys.shape  # no padding left in a decoder's own cache
            torch.testing.assert_close(lb.keys, la.keys, rtol=0, atol=1e-5)
        assert [p.tolist() for p in b.positions] == [p.tolist() for p in a.positions]


def _feed_alone(d: Decoder) -> None:
    """What ``step()`` does first when its token is not fed yet: its own forward."""
    if d._pending is None:
        d._pending = d._forward([d.ids[-1]], [len(d.ids) - 1])
        d._after_forward(d._pending)


@pytest.mark.parametrize(
    "prompts, batches", [(PROMPTS, GATHERED), (SAME_LENGTH, REGROUPED)], ids=["padded", "shared"]
)
def test_batches_that_change_members_step_as_alone(tiny_lm, prompts, batches):
    """Batches whose members change from one forward to the next, as a gatherer makes them,
    leave no state behind: each row's logits are its own forward's at every step."""
    alone = _decoders(tiny_lm, prompts, temperature=1.0, top_k=40)
    together = _decoders(tiny_lm, prompts, temperature=1.0, top_k=40)
    for batch in batches:
        feed_together([together[i] for i in batch])
        for i in batch:
            a, b = alone[i], together[i]
            _feed_alone(a)
            # a row differs from a lone forward by rounding only (7.5e-8 at most, measured)
            torch.testing.assert_close(b._pending.logits, a._pending.logits, rtol=0, atol=1e-6)
            assert b.step().token_id == a.step().token_id
    assert [d.ids for d in together] == [d.ids for d in alone]
    for a, b in zip(alone, together, strict=True):
        for la, lb in zip(a.cache.layers, b.cache.layers, strict=True):
            torch.testing.assert_close(lb.keys, la.keys, rtol=0, atol=1e-6)
            torch.testing.assert_close(lb.values, la.values, rtol=0, atol=1e-6)


def test_a_fed_decoder_can_step_alone_rewind_and_fork(tiny_lm):
    decs = _decoders(tiny_lm, temperature=0.9)
    ref = _decoders(tiny_lm, temperature=0.9)
    for _ in range(3):
        step_together(decs)
        for d in ref:
            d.step()
    decs[0].step()  # alone after a batch
    ref[0].step()
    decs[1].rewind(1)
    ref[1].rewind(1)
    fork = decs[2].fork()
    for d in (decs[1], fork):
        d.step()
    ref[1].step()
    assert [d.ids for d in decs[:2]] == [d.ids for d in ref[:2]]
    assert fork.ids[: len(ref[2].ids)] == ref[2].ids


def test_only_decoders_that_can_share_a_forward_are_fed(tiny_lm):
    decs = _decoders(tiny_lm, temperature=0.9)
    evicting = Decoder(tiny_lm, "The sea", PruneParams(), eviction=make_policy("h2o", 12))
    assert feed_together([*decs, evicting]) == 0  # every one still holds its prefill's logits
    for d in [*decs, evicting]:
        d.step()
    decs[0].done = True
    assert feed_together([*decs, evicting]) == 2  # done and evicting decoders run alone
    assert decs[0]._pending is None and evicting._pending is None
    assert decs[1]._pending is not None and decs[2]._pending is not None
    decs[1].step()
    assert feed_together([decs[1], evicting]) == 1  # one alone runs its own forward
    assert decs[1].fed and not evicting.fed


def test_threads_gathered_into_one_forward_get_their_own_tokens(tiny_lm):
    """Sessions' threads hand their decoders to one gatherer; the batches it runs are rows.

    Which rows share a forward changes from run to run; the top 40 keep the draws clear of
    rounding (see the module's docstring), so the tokens are the same every run."""
    alone = _decoders(tiny_lm, temperature=1.0, top_k=40)
    together = _decoders(tiny_lm, temperature=1.0, top_k=40)
    for d in alone:
        d.run(8)

    def slow_feed(decoders: list[Decoder]) -> None:
        time.sleep(0.05)  # a forward of the real model's length: the others arrive meanwhile
        feed_together(decoders)

    gather = Gather(ForwardQueue(), slow_feed)
    start = threading.Barrier(len(together))

    def session(d: Decoder) -> None:
        start.wait(10)
        for _ in range(8):
            gather.submit(d)
            d.step()

    assert not in_threads(session, together)
    assert [d.ids for d in together] == [d.ids for d in alone]
    for a, b in zip(alone, together, strict=True):  # each row's own logits, to rounding
        for x, y in zip(a.trace.steps, b.trace.steps, strict=True):
            torch.testing.assert_close(y.cand_logits, x.cand_logits, rtol=0, atol=1e-6)
    assert gather.rows > gather.batches  # some forwards really were shared


def test_sessions_in_lanes_decode_side_by_side_and_get_their_own_tokens(tiny_lm):
    """With a lane each, sessions' forwards run at the same moment (each thread waits inside
    its turn until all hold one) and each is the same computation as alone."""
    alone, side = _decoders(tiny_lm, temperature=1.0), _decoders(tiny_lm, temperature=1.0)
    for d in alone:
        d.run(8)
    q = ForwardQueue(poll=0.01, lanes=len(side))
    all_in = threading.Barrier(len(side))

    def session(d: Decoder) -> None:
        for _ in range(8):
            with q.turn(f"session {id(d)}"):
                all_in.wait(10)  # one lane short, and this times out
                d.step()

    assert not in_threads(session, side)
    assert [d.ids for d in side] == [d.ids for d in alone]
    for a, b in zip(side, alone, strict=True):  # the same bits, not only the same picks
        assert all(
            torch.equal(x.cand_logits, y.cand_logits)
            for x, y in zip(a.trace.steps, b.trace.steps, strict=True)
        )
    assert q.state().served == 8 * len(side)
