"""What the server keeps of a host's stamps of a job's log (runs/log_stamps.py: checked): a host
may be hostile or its clock wrong, and whatever it sends, the kept stamps lie within the bytes
copied, in order, never before the stamp above them nor after the server's clock."""

from __future__ import annotations

import random
import time

import pytest

from runs.log_stamps import checked

NOW = 1_800_000_000_000


def _sane(kept, start, end, last, now=NOW):
    offsets = [offset for offset, _ in kept]
    times = [ms for _, ms in kept]
    assert all(start <= offset < end for offset in offsets), kept
    assert offsets == sorted(set(offsets)), kept
    assert times == sorted(times) and all(ms <= now for ms in times), kept
    assert not last or not times or times[0] >= last[1], kept


def test_the_stamps_of_a_well_behaved_host_are_kept_as_they_are():
    assert checked([(0, NOW - 3000), (4, NOW - 2000)], 0, 8, None, NOW) == [(0, NOW - 3000), (4, NOW - 2000)]
    # the stamp in force where the bytes begin (before them) stands for their start
    assert checked([(2, NOW - 3000), (9, NOW - 1000)], 6, 12, (2, NOW - 3000), NOW) == [(9, NOW - 1000)]


def test_bytes_without_any_stamp_get_the_time_the_server_copied_them():
    assert checked([], 10, 20, (0, NOW - 5000), NOW) == [(10, NOW)]
    assert checked([], 0, 20, None, NOW) == [(0, NOW)]


@pytest.mark.parametrize("records, expected", [
    ([(0, NOW + 10**9)], [(0, NOW)]),  # in the future: the server's clock
    ([(0, NOW - 10), (5, 3)], [(0, NOW - 10)]),  # before the line above: that line's time
    ([(0, NOW - 50), (6, NOW - 40), (3, NOW - 30)], [(0, NOW - 50), (6, NOW - 40)]),  # out of order: left out
    ([(0, NOW - 50), (99, NOW - 40), (2**64 - 1, 2**64 - 1)], [(0, NOW - 50)]),  # outside the bytes copied
])
def test_stamps_out_of_order_outside_or_ahead_are_dropped_or_clamped(records, expected):
    assert checked(records, 0, 10, None, NOW) == expected


def test_no_stamp_is_kept_from_before_the_job_started():
    assert checked([(0, 5), (4, NOW - 100)], 0, 8, None, NOW, earliest=NOW - 1000) == [(0, NOW - 1000), (4, NOW - 100)]


def test_garbage_stamps_never_make_an_insane_answer():
    rng = random.Random(38)
    for _ in range(2000):
        start = rng.randrange(0, 100)
        end = start + rng.randrange(0, 50)
        last = rng.choice([None, (max(0, start - 1), rng.randrange(0, NOW))])
        records = [(rng.choice([rng.randrange(0, 200), 2**64 - 1]), rng.choice([0, rng.randrange(0, 2 * NOW), 2**64 - 1]))
                   for _ in range(rng.randrange(0, 8))]
        _sane(checked(records, start, end, last, NOW), start, end, last)


@pytest.mark.django_db
def test_a_host_stamping_every_byte_keeps_stamps_to_a_quarter_of_the_log(settings, tmp_path):
    """A hostile host (or a job writing its own output.times) may send a stamp per byte: what the
    server keeps stays within a quarter of the log's bytes past a small allowance, not 16 times it."""
    from projects.models import Project
    from runner.log_times import RECORD
    from runs.log_stamps import append, times_path
    from runs.models import Job, Run

    settings.MUSTER = {**settings.MUSTER, "LOG_DIR": tmp_path}
    run = Run.objects.create(project=Project.objects.create(name="stamps"), name="r", configuration={})
    job = Job.objects.create(run=run, job_num=0, node_group_name="g", spec={})
    times_path(job).parent.mkdir(parents=True, exist_ok=True)
    size, now = 1 << 16, int(time.time() * 1000) - 10**7
    for start in range(0, size, 4096):
        append(job, start, b"x" * 4096, [(offset, now + offset) for offset in range(start, start + 4096)])
    kept = times_path(job).stat().st_size
    assert kept % RECORD.size == 0 and RECORD.size * 64 < kept <= size // 4 + 64 * RECORD.size, kept
