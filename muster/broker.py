"""The embedded broker: kombu's filesystem transport with messages that appear whole or not at all.

kombu's own writer creates `<ts>_<uuid>.<queue>.msg` and then fills it, while its reader takes any
file of that name it sees. A reader that comes between the two reads an empty or half-written
file and the worker dies with `Unrecoverable error: JSONDecodeError` (kombu#1551). Here a message
is written under a name no reader looks for and renamed into place when it is complete: a rename
within one directory is atomic, so a reader sees the finished file or nothing. The reader moves
a message into the processed folder by rename too (kombu's `shutil.move` to the system temp dir
becomes copy-then-delete when that is another filesystem, and two readers can then copy the same
message at once). The 0.1 s polling of the filesystem transport is kept; this costs one rename.

Selected in settings.py with CELERY_BROKER_TRANSPORT when the broker URL is `filesystem://`.
"""

from __future__ import annotations

import logging
import os
import uuid
from queue import Empty
from time import monotonic

from kombu.transport import filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads
from kombu.utils.objects import cached_property

log = logging.getLogger(__name__)

# a name the readers never take: they want `<anything>.<queue>.msg`, and this has no `.msg` end
PARTIAL = ".{}.partial"


def _write_whole(folder: str, name: str, data: bytes) -> str:
    partial = os.path.join(folder, PARTIAL.format(uuid.uuid4().hex))
    try:
        with open(partial, "wb") as f:
            f.write(data)
        final = os.path.join(folder, name)
        os.rename(partial, final)
    except BaseException:
        try:
            os.unlink(partial)
        except OSError:
            pass
        raise
    return final


class Channel(filesystem.Channel):
    @cached_property
    def processed_folder(self):
        # taken messages are renamed into it, so it must exist: a failed rename reads as "another
        # reader took it first", and a missing folder would silently leave every message unread
        folder = self.transport_options.get("processed_folder", "processed")
        os.makedirs(folder, exist_ok=True)
        return folder

    def _put(self, queue, payload, **kwargs):
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        try:
            _write_whole(self.data_folder_out, name, str_to_bytes(dumps(payload)))
        except OSError as exc:
            raise filesystem.ChannelError(f"Cannot add message {name!r} to {self.data_folder_out!r}") from exc

    def _get(self, queue):
        wanted = f"{queue}.msg"
        for name in sorted(os.listdir(self.data_folder_in)):
            if name.partition(".")[2] != wanted:
                continue
            taken = os.path.join(self.processed_folder, name)
            try:
                # whoever renames it first owns it; the others find it gone and go on
                os.rename(os.path.join(self.data_folder_in, name), taken)
            except OSError:
                continue
            try:
                with open(taken, "rb") as f:
                    data = f.read()
            except OSError as exc:
                raise filesystem.ChannelError(f"Cannot read message {taken!r}") from exc
            try:
                message = loads(bytes_to_str(data))
            except ValueError:
                # Not written by this transport (an older writer, a hand-made file): set aside and
                # said, never the worker's death. Tasks are nudges; the sweeps resend what matters.
                os.replace(taken, taken + ".unreadable")
                log.error("broker: set aside unreadable message %s (%d bytes)", taken + ".unreadable", len(data))
                continue
            if not self.store_processed:
                os.unlink(taken)
            return message
        raise Empty()

    def _queue_bind(self, exchange, routing_key, pattern, queue):
        # kombu creates the exchange table with open("wb") and locks it afterwards, so a publisher
        # to that exchange can read it empty in between. The first table is linked into place whole;
        # later changes go through kombu's locked read-modify-write, which is sound.
        file = self._exchange_file(exchange)
        self.control_folder.mkdir(exist_ok=True)
        if not file.exists():
            entry = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
            partial = self.control_folder / PARTIAL.format(uuid.uuid4().hex)
            partial.write_bytes(str_to_bytes(dumps([entry])))
            try:
                os.link(partial, file)
                return
            except FileExistsError:
                pass  # another process made it first: add to theirs
            finally:
                partial.unlink()
        super()._queue_bind(exchange, routing_key, pattern, queue)


class Transport(filesystem.Transport):
    Channel = Channel
    global_state = filesystem.Transport.global_state
