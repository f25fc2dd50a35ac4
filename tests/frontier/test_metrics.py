"""Word-level text metrics on fixed texts with known answers."""

from __future__ import annotations

import doctest
import math

import pytest

import semviz.analysis.metrics
from semviz.analysis.metrics import (
    distinct_n,
    pooled_distinct,
    repetition_rate,
    self_bleu,
    word_metrics,
    words,
)


def test_words_lowercase_and_drop_punctuation():
    assert words("The cat, the CAT!\n  It's here.") == ["the", "cat", "the", "cat", "it's", "here"]


def test_words_keep_code_identifiers_whole():
    assert words("def is_palindrome(s):\n    return s == s[::-1]") == [
        "def",
        "is_palindrome",
        "s",
        "return",
        "s",
        "s",
        "1",
    ]


def test_word_metrics_of_a_plain_sentence():
    m = word_metrics("The cat sat on the mat.")
    assert m["n_words"] == 6
    assert m["distinct_1"] == pytest.approx(5 / 6)  # "the" twice
    assert m["distinct_2"] == 1.0  # five different bigrams
    assert m["repetition"] == 0.0  # three 4-grams, none repeated


def test_word_metrics_of_a_loop():
    m = word_metrics("a b a b a b")
    assert m["distinct_1"] == pytest.approx(2 / 6)
    assert m["distinct_2"] == pytest.approx(2 / 5)  # ab ba ab ba ab
    assert m["repetition"] == pytest.approx(1 / 3)  # abab baba abab: the third repeats


def test_a_text_too_short_for_four_grams_is_undefined_not_fully_repeated():
    m = word_metrics("Hello there.")
    assert m["n_words"] == 2
    assert m["distinct_1"] == 1.0 and m["distinct_2"] == 1.0
    assert math.isnan(m["repetition"])
    empty = word_metrics("  ...  ")
    assert empty["n_words"] == 0
    assert all(math.isnan(empty[k]) for k in ("distinct_1", "distinct_2", "repetition"))


def test_word_and_token_metrics_share_one_definition():
    ids = [5, 6, 5, 6, 7]
    text = "x y x y z"
    m = word_metrics(text)
    assert m["distinct_1"] == distinct_n(ids, 1)
    assert m["distinct_2"] == distinct_n(ids, 2)
    assert math.isnan(m["repetition"]) is math.isnan(repetition_rate(ids))


def test_metrics_docstring_examples():
    result = doctest.testmod(semviz.analysis.metrics, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


# -- diversity between a prompt's continuations -------------------------------------------


def test_pooled_distinct_counts_ngrams_over_every_text_without_spanning_two():
    assert pooled_distinct(["a b c", "a b d"], 2) == pytest.approx(3 / 4)
    # copies of one text score 1/k of its own distinct-n
    assert pooled_distinct(["x y z w"] * 4, 2) == pytest.approx(0.25)
    # "c a" would span the two texts: it is not an n-gram of either
    assert pooled_distinct(["a b c", "a b c"], 2) == pytest.approx(2 / 4)
    assert math.isnan(pooled_distinct(["a", "b"], 2))  # no text has a bigram
    assert pooled_distinct(["The cat.", "the CAT"], 1) == pytest.approx(2 / 4)


def test_self_bleu_of_copies_is_one_of_disjoint_texts_zero():
    assert self_bleu(["the cat sat on the mat"] * 3) == pytest.approx(1.0)
    assert self_bleu(["a b c d e", "f g h i j", "k l m n o"]) == 0.0


def test_self_bleu_is_sacrebleu_of_each_text_against_the_others():
    from sacrebleu.metrics import BLEU

    texts = ["The cat sat on the mat today.", "A cat sat on the mat, yesterday!", "Dogs run."]
    ws = ["the cat sat on the mat today", "a cat sat on the mat yesterday", "dogs run"]
    bleu = BLEU(tokenize="none", effective_order=True)
    want = sum(bleu.sentence_score(ws[i], ws[:i] + ws[i + 1 :]).score for i in range(3)) / 300
    assert self_bleu(texts) == pytest.approx(want, abs=1e-12)
    assert 0.0 < want < 1.0


def test_self_bleu_leaves_out_texts_without_words():
    assert math.isnan(self_bleu(["the cat sat on the mat", "...", ""]))  # one text left
    assert math.isnan(self_bleu(["x"]))
    assert self_bleu(["the cat sat", "the cat sat", "  "]) == pytest.approx(1.0)
