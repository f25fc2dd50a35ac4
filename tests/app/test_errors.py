"""A failure shows the user one sentence; a bug's traceback goes to the server's log."""

from __future__ import annotations

import logging

from semviz.decoding.decoder import PromptError
from ui.errors import guard, report


def _boom() -> None:
    raise KeyError("logits")


def test_a_bug_is_one_sentence_for_the_user_and_a_traceback_in_the_log(caplog):
    caplog.set_level(logging.INFO, logger="semviz.app")
    with guard("the token strip", show=False) as err:
        _boom()
    assert err == ["Something went wrong in the token strip: 'logits'"]
    (rec,) = caplog.records
    assert rec.levelno == logging.ERROR and rec.exc_info is not None
    assert "_boom" in caplog.text and "Traceback" in caplog.text


def test_a_user_error_is_logged_as_one_line_without_a_traceback(caplog):
    caplog.set_level(logging.INFO, logger="semviz.app")
    said = report(PromptError("the prompt is empty"), "Step")
    assert said == "Prompt not accepted: the prompt is empty"
    (rec,) = caplog.records
    assert rec.levelno == logging.INFO and rec.exc_info is None
    assert rec.getMessage() == "Prompt not accepted: the prompt is empty (Step)"
    assert report(ValueError("top_p must be in (0, 1]")) == (
        "Settings not accepted: top_p must be in (0, 1]"
    )


def test_nothing_raised_leaves_the_box_empty():
    with guard("anything", show=False) as err:
        pass
    assert err == []
