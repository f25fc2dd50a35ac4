"""What-if for the pages: the recorded steps re-pruned with the current sliders.

All the work is ``semviz.analysis.replay`` (the one replay the CLI and reports use too); this module
only names what the pages call. ``cached`` memoises in ``SessionData.replay_memo``, so a rerun with
unchanged sliders costs nothing.
"""

from __future__ import annotations

from semviz.analysis.replay import GravityCache, WhatIf, cached, needs_new_gravity, replay

__all__ = ["GravityCache", "WhatIf", "cached", "needs_new_gravity", "replay"]
