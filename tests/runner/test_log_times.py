"""The runner stamps each part of a job's output as its pump receives it (runner/log_times.py):
output.times next to output.log, within the job's log limit, and the `log --times` verb's framed
answer, driven through the zipapp and a real agent as hosts run them."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from runner.log_times import unframe, unpack
from tests.runner.runner_helpers import cli, job_spec, submit, wait_state
from tests.runner.test_runner_processes import agent, home  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(60)


def test_each_line_is_stamped_when_the_runner_received_it(home: Path, agent):  # noqa: F811
    before = int(time.time() * 1000)
    submit(home, "j1", job_spec("j1", ["echo one; sleep 1; echo two"]))
    wait_state(home, "j1", ("done",), timeout=30)
    after = int(time.time() * 1000)
    job = home / "jobs" / "j1"
    assert (job / "output.log").read_bytes() == b"one\ntwo\n"
    records = unpack((job / "output.times").read_bytes())
    assert [offset for offset, _ in records] == [0, 4]
    (_, one), (_, two) = records
    assert before <= one <= two <= after
    assert two - one >= 900, "a second of sleep lies between the two lines"

    # the verb the server reads a log with: the bytes from an offset, and the stamps of them
    answer = cli(home, "log", "--job", "j1", "--times")
    assert answer.returncode == 0, answer.stderr
    assert unframe(answer.stdout, 1 << 20) == (b"one\ntwo\n", records)
    # from the middle of the first line: its stamp is the one in force there
    answer = cli(home, "log", "--job", "j1", "--offset", "2", "--limit", "3", "--times")
    assert unframe(answer.stdout, 1 << 20) == (b"e\nt", records)
    # the plain verb is unchanged
    assert cli(home, "log", "--job", "j1").stdout == b"one\ntwo\n"


def test_the_stamps_count_against_the_jobs_log_limit(home: Path, agent):  # noqa: F811
    limit = 600
    submit(home, "j2", job_spec("j2", ["for i in $(seq 1 80); do echo line$i; sleep 0.02; done"], log_limit=limit))
    wait_state(home, "j2", ("done",), timeout=30)
    job = home / "jobs" / "j2"
    log, times = (job / "output.log").read_bytes(), (job / "output.times").read_bytes()
    assert times, "the lines are stamped"
    assert len(log) + len(times) <= limit
    assert b"reached its log limit" in log
    offsets = [offset for offset, _ in unpack(times)]
    assert offsets == sorted(set(offsets)) and offsets[-1] < len(log)


def test_a_fifo_the_job_put_in_place_of_its_stamps_does_not_hold_the_log_read(home: Path):  # noqa: F811
    job = home / "jobs" / "j3"
    job.mkdir(parents=True)
    (job / "output.log").write_bytes(b"hello\n")
    os.mkfifo(job / "output.times")
    answer = cli(home, "log", "--job", "j3", "--times", timeout=10)
    assert answer.returncode == 0, answer.stderr
    assert unframe(answer.stdout, 1 << 20) == (b"hello\n", [])


@pytest.mark.parametrize("body", [
    b"", b"garbage", b"12 x\nabc", b"-1 0\n", b"99999999999999999999999 0\nabc",
    b"3 40\nabc" + b"\xff" * 40,  # two and a half records: the torn one is left out
])
def test_a_framed_answer_that_is_not_one_gives_no_bytes_or_only_whole_records(body):
    data, records = unframe(body, 1 << 20)
    assert len(records) <= 2 and all(len(r) == 2 for r in records)
    assert data in (b"", b"abc")
