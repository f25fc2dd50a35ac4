"""Scenario presets (seed §7.1): no single best pruning setting, only the best per scenario."""

from __future__ import annotations

from dataclasses import dataclass

from semviz.sampling import PruneParams

__all__ = ["PRESETS", "Preset", "get_preset"]


@dataclass(frozen=True)
class Preset:
    """A named :class:`PruneParams` with the reason for it and a prompt to try it on."""

    name: str
    params: PruneParams
    why: str
    explanation: str
    example_prompt: str


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            name="code",
            params=PruneParams(
                temperature=0.3,
                top_p=0.8,
                gravity_lambda=0.6,
                gravity_kind="pull",
                gravity_mass="attention",
                gravity_mode="rerank",
                rerank_k=32,
                free_energy=True,
                free_energy_kappa=1.0,
                fallback=True,
            ),
            why="Code needs certainty: low temperature, a small nucleus and strong pull to the context's names.",
            explanation=(
                "Code has one right token far more often than prose. A low temperature "
                "sharpens the distribution, top-p 0.8 cuts the long tail, and gravity reranks "
                "the top candidates towards identifiers the context already attends to. The "
                "free-energy filter keeps only tokens within T·H nats of the best one, so when "
                "the model is sure it commits. The fallback undoes all of it if the output starts to loop."
            ),
            example_prompt='def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
        ),
        Preset(
            name="story",
            params=PruneParams(
                temperature=0.9,
                top_p=0.95,
                min_p=0.02,
                adaptive="target",
                target_entropy=2.5,
                controller_gain=0.1,
                controller_sign=-1,
                fallback=True,
            ),
            why="Stories need variety that still holds together: medium temperature and entropy control; gravity off (it varies the words, not what the seeds say).",
            explanation=(
                "A story should surprise without drifting. The target-entropy controller cools "
                "the step when the model is unsure (entropy above 2.5 nats) and warms it when "
                "the text gets predictable. Gravity stays off: on the 120 test prompts the "
                "default gravity is more coherent than plain sampling at the same word-level "
                "diversity, but at the same diversity of meaning between seeds it ties, so it "
                "buys varied wording rather than varied stories (docs/gravity.md)."
            ),
            example_prompt="Once upon a time, in a village at the edge of a frozen sea,",
        ),
        Preset(
            name="qa",
            params=PruneParams(
                temperature=0.5,
                top_k=40,
                top_p=0.9,
                gravity_lambda=1.0,
                gravity_kind="pull",
                gravity_mass="attention",
                gravity_space="hidden",
                fallback=True,
            ),
            why="Answers must stay faithful to the question: strong gravity towards what the context attends to.",
            explanation=(
                "In question answering the right words are usually already in the context. "
                "Strong gravity in the final hidden space, weighted by where the model looks, "
                "pulls the answer towards them; a moderate temperature and top-k 40 keep it "
                "from wandering. Pair it with a conservative KV-cache policy."
            ),
            example_prompt="The Eiffel Tower is in Paris. The Colosseum is in Rome.\nQ: Where is the Colosseum?\nA:",
        ),
        Preset(
            name="brainstorm",
            params=PruneParams(
                temperature=1.3,
                min_p=0.02,
                adaptive="edt",
                edt_theta=0.5,
                edt_n=0.8,
                fallback=True,
            ),
            why="Brainstorming wants exploration: high temperature, high entropy tolerance, light pruning.",
            explanation=(
                "Ideas come from the tail. A high base temperature flattens the distribution; "
                "EDT lowers it only on steps where the model is already certain (low entropy), "
                "so structure words stay right while content words vary. Min-p 0.02 is the only "
                "cut, and it scales with the top token, so it stays out of the way when the "
                "model is unsure."
            ),
            example_prompt="Ten unusual uses for an old umbrella:\n1.",
        ),
    )
}


def get_preset(name: str) -> Preset:
    """The preset called ``name``; ``ValueError`` listing the names otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}") from None
