"""Does it help? Settings × knob × prompts, decoded as rows of one batched ``generate()``
(``batched``), scored by an outside judge and summarised as a coherence–diversity frontier
(``sweep``). The sweep's names are re-exported here (``semviz.frontier.PROMPTS_PATH``)."""

from semviz.frontier.sweep import *  # noqa: F403
from semviz.frontier.sweep import __all__  # noqa: F401
