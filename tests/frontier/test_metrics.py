"""Word-level text metrics on fixed texts with known answers."""

from __future__ import annotations

import doctest
import math

import pytest

import semviz.analysis.metrics
from semviz.analysis.metrics import distinct_n, repetition_rate, word_metrics, words


def test_words_lowercase_and_drop_punctuation():
    assert words("The cat, the CAT!\n  It's here.") == ["the", "cat", "the", "cat", "it's", "here"]


def test_words_keep_code_identifiers_whole():
    assert words("def is_palindrome(s):\n    return s == s[::-1]") == [
        "def", "is_palindrome", "s", "return", "s", "s", "1",
    ]  # fmt: skip


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
