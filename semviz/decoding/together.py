"""Several decoders stepped as rows of one batch: sessions of one server, Compare's sides.

A decoder's next forward can share a batch with others when it keeps its full cache (no
eviction) and reads with the same model. Rows at one position share a cache that later steps
reuse (:class:`_SharedRows`); rows at different positions are padded into one batch and each
row's new entries are appended to its own cache. A row's logits equal those of its own forward
up to float rounding (``tests/decoding/test_together.py``), so a draw that lands between two
tokens whose logits are that close can pick the other one.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from semviz.decoding.decoder import Decoder
from semviz.model.forward import Forward, KVRows, forward
from semviz.output.trace import StepRecord


def step_together(decoders: Sequence[Decoder]) -> list[StepRecord | None]:
    """One ``step()`` of every decoder; forwards that can be shared run as rows of one batch
    (:func:`feed_together`). Returns what each ``step()`` returned (None for one that is done).
    """
    feed_together(decoders)
    return [d.step() for d in decoders]


def feed_together(decoders: Sequence[Decoder]) -> int:
    """Feed every decoder's last token that can share a forward as rows of one batch.

    Decoders share a forward when they read with the same model and keep their full cache (no
    eviction); one left without a partner runs its own forward here. Each is left with its
    next step's logits ready (``_pending``), so its ``step()`` runs no model, exactly as
    after its prefill; the others (done, evicting, already fed) are left alone. Rows at the same position share one cache that
    later steps reuse; rows at different positions (sessions of one server) are padded into
    one batch, and each row's new entries are appended to its own cache. A row's logits
    equal those of its own forward up to float rounding (``tests/decoding/test_together.py``).

    Returns how many decoders were fed.
    """
    groups: dict[int, list[Decoder]] = {}
    for d in decoders:
        if d.can_share:
            groups.setdefault(id(d.lm), []).append(d)
    fed = 0
    for group in groups.values():
        if len(group) == 1:
            _feed_alone(group[0])
        elif len({len(d.ids) for d in group}) == 1:
            _feed_aligned(group)
        else:
            _feed_padded(group)
        fed += len(group)
    return fed


def _feed_alone(d: Decoder) -> None:
    with d.transaction():
        d._pending = d._forward([d.ids[-1]], [len(d.ids) - 1])
        d._after_forward(d._pending)


def _feed_aligned(group: list[Decoder]) -> None:
    """Rows at one position: a shared cache whose rows the decoders' caches are views of."""
    rows = group[0]._rows
    if rows is None or not rows.serves(group):
        rows = _SharedRows(group)
    n = len(group[0].ids)
    dev = group[0]._on_device
    ids = torch.tensor([[d.ids[-1]] for d in group], dtype=torch.long, device=dev)  # (B, 1)
    pos = torch.full((len(group), 1), n - 1, dtype=torch.long, device=dev)  # (B, 1)
    capture = any(d.settings.capture or d._needs_attention() for d in group)
    lens = any(d.settings.lens for d in group)
    masks = rows.kv.masks(1)  # None: the rows hold the same positions
    try:
        out = forward(
            group[0].lm.model, ids, pos, rows.kv.cache, capture=capture, masks=masks, lens=lens
        )
    except BaseException:
        for d in group:  # the shared cache may hold part of the batch: rebuild it next time
            d._rows = None
        raise
    rows.kv.append(torch.tensor([n - 1]))
    rows.lend_views()
    for r, d in enumerate(group):
        with d.transaction():  # a row whose head raises is left as it was, unfed
            rows.lend(r)
            d._pending = d._forward([d.ids[-1]], [n - 1], shared=(out, r))
            d._after_forward(d._pending)


def _feed_padded(group: list[Decoder]) -> None:
    """Rows at different positions: their caches copied into one padded batch, the new
    entries appended to each decoder's own cache (which never holds padding)."""
    for d in group:
        d._rows = None  # a decoder's cache stops being a view of an earlier shared batch
    kv = KVRows.stack([d.cache for d in group], [d.positions for d in group])
    held = kv.valid[:, 0, : kv.lengths[0]]  # (B, S): without eviction every layer holds alike
    dev = group[0]._on_device
    last = [len(d.ids) - 1 for d in group]
    ids = torch.tensor([[d.ids[-1]] for d in group], dtype=torch.long, device=dev)  # (B, 1)
    pos = torch.tensor([[p] for p in last], dtype=torch.long, device=dev)  # (B, 1)
    capture = any(d.settings.capture or d._needs_attention() for d in group)
    lens = any(d.settings.lens for d in group)
    out = forward(
        group[0].lm.model, ids, pos, kv.cache, capture=capture, masks=kv.masks(1), lens=lens
    )
    new = torch.ones(1, dtype=torch.bool)
    for r, d in enumerate(group):
        att = None
        if out.attention is not None:  # this row's slots only, in its own cache's order
            keep = torch.cat([held[r], new]).to(out.attention.device)  # (S + 1,)
            att = out.attention[:, r : r + 1][..., keep]  # (L, 1, H, n_r)
        # the row's share of the batch's time is its forward time
        row = Forward(
            out.hidden[r : r + 1],
            att,
            out.seconds / len(group),
            None if out.lens is None else out.lens.row(r),
        )
        with d.transaction():  # a row whose head raises is left as it was, unfed
            for mine, lay in zip(d.cache.layers, kv.cache.layers, strict=True):
                mine.keys = torch.cat([mine.keys, lay.keys[r : r + 1, :, -1:]], dim=-2)
                mine.values = torch.cat([mine.values, lay.values[r : r + 1, :, -1:]], dim=-2)
            d._pending = d._forward([d.ids[-1]], [last[r]], shared=(row, 0))
            d._after_forward(d._pending)


class _SharedRows:
    """One cache for decoders stepped together (row ``r`` is decoder ``r``'s).

    Each decoder's own cache layers are views of its row (:meth:`lend`), so its recorded
    bytes stay its own and it can go on stepping alone; a decoder that did (or rewound) no
    longer holds the views, and the group is rebuilt from the decoders' caches.
    """

    def __init__(self, group: list[Decoder]) -> None:
        self.members = list(group)
        self.kv = KVRows.stack([d.cache for d in group], [d.positions for d in group])
        self._views: list[torch.Tensor] = []
        self.lend()
        for d in group:
            d._rows = self

    def lend_views(self) -> None:
        """Forget the views lent before the last forward (each row is lent again by
        :meth:`lend`, so a row left unfed keeps its old views and rebuilds the group)."""
        self._views = [None] * len(self.members)

    def lend(self, row: int | None = None) -> None:
        """Point a member's (default: every member's) cache layers at its row of the cache."""
        if row is None:
            self.lend_views()
        for r, d in enumerate(self.members):
            if row is not None and r != row:
                continue
            for mine, lay in zip(d.cache.layers, self.kv.cache.layers, strict=True):
                mine.keys, mine.values = lay.keys[r : r + 1], lay.values[r : r + 1]
            self._views[r] = d.cache.layers[0].keys

    def serves(self, group: list[Decoder]) -> bool:
        """True when ``group`` is this one and every member still reads its row."""
        return len(group) == len(self.members) and all(
            d is m and d.cache.layers[0].keys is v
            for d, m, v in zip(group, self.members, self._views, strict=True)
        )
