"""The embedded broker never hands a reader a message its writer has not finished (kombu#1551).

A writer process publishes big messages through kombu while this process takes them as fast as it
can, the way a Celery worker polls the filesystem queue. kombu's own filesystem transport lets the
reader take a file its writer has created but not yet filled; Muster's (muster/broker.py) does not.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from kombu import Connection

from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
OLD = "kombu.transport.filesystem:Transport"
NEW = "muster.broker:Transport"
BIG = 4 << 20  # a message big enough that writing it takes a while

WRITER = """
import sys
from pathlib import Path
from kombu import Connection
transport, folder, count = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
body = "x" * int(sys.argv[4])
with Connection("filesystem://", transport=transport, transport_options={
        "data_folder_in": str(folder / "queue"), "data_folder_out": str(folder / "queue"),
        "processed_folder": str(folder / "processed"), "control_folder": str(folder / "control")}) as conn:
    producer = conn.Producer(serializer="json")
    n = 0
    while (count == 0 or n < count) and not (folder / "stop").exists():
        producer.publish({"n": n, "body": body}, exchange="", routing_key="torn")
        n += 1
"""


def connect(transport: str, folder: Path) -> Connection:
    for sub in ("queue", "processed", "control"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    return Connection("filesystem://", transport=transport, transport_options={
        "data_folder_in": str(folder / "queue"), "data_folder_out": str(folder / "queue"),
        "processed_folder": str(folder / "processed"), "control_folder": str(folder / "control"),
        "polling_interval": 0.01})


def start_writer(transport: str, folder: Path, count: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WRITER, transport, str(folder), str(count), str(BIG)], cwd=ROOT)


def test_kombus_filesystem_transport_lets_a_reader_take_a_half_written_message(tmp_path):
    """The failure itself, on the old transport: without this the test below proves nothing."""
    conn = connect(OLD, tmp_path)
    channel = conn.channel()
    writer = start_writer(OLD, tmp_path, 0)
    torn: list[Exception] = []

    def reader_saw_a_torn_message() -> bool:
        end = time.monotonic() + 1
        while time.monotonic() < end:
            try:
                channel.basic_get("torn", no_ack=True)
            except ValueError as exc:  # json.JSONDecodeError
                torn.append(exc)
                return True
        return False

    try:
        wait_until(reader_saw_a_torn_message, timeout=120, interval=0, what="a torn read on the old transport")
    finally:
        (tmp_path / "stop").touch()
        writer.wait(30)
        conn.release()
    assert "Expecting value" in str(torn[0]) or "Unterminated" in str(torn[0])


@pytest.mark.parametrize("count", [150])
def test_the_embedded_broker_hands_out_every_message_whole(tmp_path, count):
    conn = connect(NEW, tmp_path)
    channel = conn.channel()
    writer = start_writer(NEW, tmp_path, count)
    seen: list[int] = []

    def all_taken() -> bool:
        end = time.monotonic() + 1
        while time.monotonic() < end and len(seen) < count:
            message = channel.basic_get("torn", no_ack=True)  # a torn message raises here
            if message is not None:
                payload = message.decode()
                assert len(payload["body"]) == BIG, "the message arrives whole"
                seen.append(payload["n"])
        return len(seen) == count

    try:
        wait_until(all_taken, timeout=300, interval=0, what=f"{count} messages")
    finally:
        (tmp_path / "stop").touch()
        writer.wait(30)
        conn.release()
    assert sorted(seen) == list(range(count)), "each message once"
    assert not list((tmp_path / "processed").iterdir()), "nothing left behind or set aside"
    assert not [p for p in (tmp_path / "queue").iterdir()], "no partial file left in the queue"


def test_a_message_file_that_is_not_json_is_set_aside_and_the_reader_goes_on(tmp_path, caplog):
    # what an older writer may have left in the queue folder: said, kept for a look, never fatal
    # ("0_" sorts before every name this transport writes, so it is read first)
    conn = connect(NEW, tmp_path)
    channel = conn.channel()
    (tmp_path / "queue" / "0_x.torn.msg").write_bytes(b'{"body": "hal')
    conn.Producer(serializer="json").publish({"n": 1, "body": "whole"}, exchange="", routing_key="torn")
    message = wait_until(lambda: channel.basic_get("torn", no_ack=True), timeout=10, what="the good message")
    assert message.decode() == {"n": 1, "body": "whole"}
    assert (tmp_path / "processed" / "0_x.torn.msg.unreadable").read_bytes() == b'{"body": "hal'
    assert "set aside unreadable message" in caplog.text
    conn.release()


def test_queues_bound_to_a_fanout_exchange_are_all_in_its_table(tmp_path):
    # the first bind links a whole table into place (muster/broker.py); later binds add to it
    conn = connect(NEW, tmp_path)
    channel = conn.channel()
    channel.exchange_declare("fan", type="fanout")
    channel.queue_declare("a")
    channel.queue_bind("a", "fan")
    channel.queue_declare("b")
    channel.queue_bind("b", "fan")
    assert sorted(q.queue for q in channel.get_table("fan")) == ["a", "b"]
    assert not [p for p in (tmp_path / "control").iterdir() if p.name.endswith(".partial")]
    conn.release()


def test_messages_are_delivered_when_the_processed_folder_does_not_exist_yet(tmp_path):
    # a taken message is renamed into it; were it missing, every rename would fail like a message
    # another reader took first, and nothing would ever be delivered
    conn = connect(NEW, tmp_path)
    (tmp_path / "processed").rmdir()
    conn.Producer(serializer="json").publish({"n": 7}, exchange="", routing_key="torn")
    message = wait_until(lambda: conn.channel().basic_get("torn", no_ack=True), timeout=10, what="the message")
    assert message.decode() == {"n": 7}
    conn.release()
