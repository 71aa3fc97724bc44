"""A run's nudge leaves once per commit however many of its jobs moved (engine/messages.py), kept by
the messages' own bookkeeping: a plain nudge after a conditional one still goes, a conditional one
after any does not, a nudge of a rolled-back savepoint does not count, and the next transaction
nudges afresh."""

from __future__ import annotations

import pytest
from django.db import transaction

from engine import messages

pytestmark = pytest.mark.django_db(transaction=True)


def _due(answer: bool, looked: list):
    def due() -> bool:
        looked.append(answer)
        return answer
    return due


def test_a_runs_nudge_leaves_once_per_commit(sent):
    with transaction.atomic():
        messages.process_run(1)
        messages.process_run(1)
        messages.process_run(2)
        assert sent.names() == [], "nothing leaves before the commit"
    assert sent.names() == [("process_run", 1), ("process_run", 2)]
    sent.clear()
    with transaction.atomic():
        messages.process_run(1)
    assert sent.names() == [("process_run", 1)], "the next transaction nudges afresh"


def test_a_conditional_nudge_is_saved_by_any_before_it_and_saves_no_plain_one_after_it(sent):
    looked: list = []
    with transaction.atomic():
        messages.process_run(1)
        messages.process_run_if(1, _due(True, looked))  # saved: a plain one goes anyway
        messages.process_run_if(2, _due(False, looked))
        messages.process_run_if(2, _due(True, looked))  # saved: one conditional nudge per run
        messages.process_run(2)  # still goes: the conditional one before it may find nothing due
    assert looked == [False]
    assert sent.names() == [("process_run", 1), ("process_run", 2)]


def test_a_nudge_of_a_rolled_back_savepoint_does_not_count(sent):
    with transaction.atomic():
        try:
            with transaction.atomic():
                messages.process_run(1)
                raise RuntimeError("rolled back")
        except RuntimeError:
            pass
        messages.process_run(1)
    assert sent.names() == [("process_run", 1)]
    sent.clear()
    try:
        with transaction.atomic():
            messages.process_run(3)
            raise RuntimeError("rolled back")
    except RuntimeError:
        pass
    with transaction.atomic():
        messages.process_run(3)
    assert sent.names() == [("process_run", 3)], "a rolled-back transaction's nudges save none of the next one's"


def test_outside_a_transaction_each_nudge_leaves_at_once(sent):
    looked: list = []
    messages.process_run(1)
    messages.process_run(1)
    messages.process_run_if(1, _due(True, looked))
    assert sent.names() == [("process_run", 1)] * 3 and looked == [True]
