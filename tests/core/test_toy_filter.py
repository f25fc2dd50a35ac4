"""Adding a filter is one class, registered: it then runs in the chain, the chain chart, the
what-if replay, the app's checks and inside ``model.generate``, with no edit elsewhere."""

from __future__ import annotations

import pytest
import torch

from semviz.analysis.replay import replay
from semviz.decoding.decoder import Decoder, DecodeSettings
from semviz.output import charts
from semviz.processors import FilterLogitsWarper
from semviz.sampling import FILTERS, Filter, PruneParams, prune, register, unregister
from tests.core.test_processors import generate_and_replay


class NoTop(Filter):
    """A deliberately odd toy filter, so its effect is unmistakable: drop the most probable
    token(s). Like every filter it reads the scores only, never the token ids: replay runs
    the chain over the recorded top-K candidates, not the vocabulary."""

    name, label = "no_top", "no top"

    def active(self, p):
        return True  # on whenever it is registered

    def describe(self, p):
        return "drop the most probable token"

    def mask(self, x, p, **_):
        x = x.unsqueeze(0) if x.dim() == 1 else x
        return x < x.amax(-1, keepdim=True)


@pytest.fixture()
def no_top():
    register(NoTop, after="top_k")
    try:
        yield
    finally:
        unregister("no_top")
    assert "no_top" not in [f.name for f in FILTERS]


def test_it_runs_in_the_chain_in_order(no_top):
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 2
    r = prune(x, PruneParams(top_k=10, top_p=0.99))
    assert [s.name for s in r.waterfall] == ["top_k", "no_top", "top_p"]
    top10 = torch.topk(x, 10).indices
    assert r.kept.nonzero().flatten().tolist() == sorted(top10[1:].tolist())
    # alone, on a vocabulary-sized input (no head rule: the full-length path)
    x = torch.randn(49152, generator=torch.Generator().manual_seed(1))
    r = prune(x, PruneParams())
    assert r.n_kept == 49151 and not r.kept[x.argmax()] and r.waterfall[0].name == "no_top"


def test_it_appears_in_the_chain_chart(no_top):
    stages = charts.chain_stages(PruneParams(top_k=5))
    names = [n for n, _ in stages]
    assert names.index("top-k") < names.index("no top")
    assert ("no top", "drop the most probable token") in stages


def test_it_runs_in_replay(no_top, tiny_lm):
    unregister("no_top")  # record a run without it ...
    dec = Decoder(tiny_lm, "The sea", PruneParams(), DecodeSettings(max_new_tokens=8, seed=2))
    dec.run(8)
    register(NoTop, after="top_k")  # ... and ask what it would have changed
    w = replay(dec.trace, PruneParams())
    for res, c in zip(w.results, w.chosen, strict=True):
        assert res.waterfall[-1].name == "no_top" and not res.kept[res.scores.argmax()]
        assert c != int(res.scores.argmax())


def test_it_runs_as_a_processor_in_generate(no_top, peaked_llama):
    procs = [FilterLogitsWarper("no_top", PruneParams())]
    params = PruneParams(combine="sequential", tie_rule="hf")
    generated, core_picks, pairs = generate_and_replay(peaked_llama, procs, params)
    assert torch.equal(generated, core_picks)
    for theirs, r in pairs:
        torch.testing.assert_close(theirs, r.probs, atol=1e-6, rtol=1e-5)
        alive = int(torch.isfinite(r.scores).sum())  # generate's min_new_tokens masks EOS
        assert r.n_kept == alive - 1 and not r.kept[r.scores.argmax()]  # the best token is out


def test_the_app_sees_it(no_top):
    from ui.views import filters_disjoint

    r = prune(torch.tensor([0.0, 5.0, 1.0, 0.5]), PruneParams(top_k=1))
    assert r.kept.tolist() == [False, True, False, False]  # topped up with the best token
    assert filters_disjoint(r)  # top-k keeps only what no_top drops
