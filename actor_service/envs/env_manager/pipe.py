"""Length-prefixed pickled messages between the env manager and a worker, with as few system calls as
possible."""

from __future__ import annotations

import os
import pickle
import struct
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from typing import Any

from actor_service.envs.env_manager.doorbell import Doorbell

_PROTOCOL = pickle.HIGHEST_PROTOCOL
# A frame longer than this is announced before it is written: it may not fit in the pipe, and then the
# write only finishes while the reader reads. A shorter one is announced once it is in the pipe, so the
# reader never reads (and sleeps) before the data is there.
_RING_FIRST = 4096
# The first read of a receive asks for this much: enough for any step message, and os.read allocates (and
# then shrinks) a buffer of the size asked for, which at 64 KB costs more than the read itself.
_FIRST_READ = 4096
_MORE_READ = 1 << 16


class UnreadableMessageError(Exception):
    """A message arrived whole but could not be unpickled (an object that pickles but whose class cannot be built
    again from its pickle: an exception whose __init__ takes other arguments than its args). The pipe stays in
    step: the next message is read as usual."""


class MessagePipe:
    """One end of a two-way channel carrying length-prefixed pickles: `reader` receives, `writer` sends
    (one duplex connection may be both). `channel` makes the two one-way OS pipes the env manager uses:
    a pipe write and read cost half of what a socket pair's do here.

    A receive reads whatever has arrived in one system call (possibly several queued messages), where
    multiprocessing's Connection makes two per message; on these machines a system call is several
    microseconds, a noticeable part of a light env's step. With a `doorbell`, each send is also counted in
    shared memory, so the other end can busy-wait on `signalled` rather than sleep in a read.
    """

    _HEADER = struct.Struct("<I")

    def __init__(
        self, reader: Connection, writer: Connection | None = None, doorbell: Doorbell | None = None
    ) -> None:
        self._reader = reader  # the connections own the file descriptors
        self._writer = writer
        self._fd = reader.fileno()
        self._wfd = writer.fileno() if writer is not None else self._fd
        self._buffer = bytearray()
        self._doorbell = doorbell
        self._received = 0  # messages returned by recv

    @staticmethod
    def channel(ctx: BaseContext) -> tuple[tuple[Connection, Connection], tuple[Connection, Connection]]:
        """(reader, writer) for this end and (reader, writer) for the other, over two one-way pipes."""
        down_reader, down_writer = ctx.Pipe(duplex=False)
        up_reader, up_writer = ctx.Pipe(duplex=False)
        return (up_reader, down_writer), (down_reader, up_writer)

    def fileno(self) -> int:
        return self._fd

    def send(self, message: Any) -> None:
        data = pickle.dumps(message, _PROTOCOL)
        frame = self._HEADER.pack(len(data)) + data
        doorbell = self._doorbell
        if doorbell is not None and len(frame) > _RING_FIRST:
            doorbell.ring()
        written = os.write(self._wfd, frame)
        if written < len(frame):  # interrupted by a signal: the rest as the reader makes room
            view = memoryview(frame)[written:]
            while view:
                view = view[os.write(self._wfd, view) :]
        if doorbell is not None and len(frame) <= _RING_FIRST:
            doorbell.ring()

    def has_message(self) -> bool:
        """Whether a whole message is already buffered (then `recv` does not block)."""
        buffer = self._buffer
        if len(buffer) < 4:  # the usual case: nothing buffered
            return False
        return len(buffer) >= 4 + self._HEADER.unpack_from(buffer)[0]

    def signalled(self) -> bool:
        """Whether a message has been sent that `recv` has not returned yet (buffered, or in the pipe or
        being written into it), by the doorbell; without one, whether one is buffered."""
        if self._doorbell is not None and self._doorbell.peer_sent() > self._received:
            return True
        return self.has_message()

    def poll(self) -> bool:
        """Whether `recv` would return without blocking (or raise EOFError)."""
        return self.has_message() or self._reader.poll(0)

    def recv(self) -> Any:
        """The next message; blocks until it has arrived. EOFError once the other end is closed;
        `UnreadableMessageError` for a message that arrived but cannot be unpickled."""
        if not self._buffer:  # the usual case: exactly one message arrives in one read
            chunk = os.read(self._fd, _FIRST_READ)
            if not chunk:
                raise EOFError("the other end of the pipe is closed")
            if len(chunk) >= 4 and len(chunk) == 4 + self._HEADER.unpack_from(chunk)[0]:
                self._received += 1
                try:
                    return pickle.loads(memoryview(chunk)[4:])
                except Exception as err:
                    raise UnreadableMessageError(f"{type(err).__name__}: {err}") from err
            self._buffer += chunk
        while not self.has_message():
            chunk = os.read(self._fd, _MORE_READ)
            if not chunk:
                raise EOFError("the other end of the pipe is closed")
            self._buffer += chunk
        size = self._HEADER.unpack_from(self._buffer)[0]
        data = bytes(self._buffer[4 : 4 + size])
        del self._buffer[: 4 + size]
        self._received += 1
        try:
            return pickle.loads(data)
        except Exception as err:
            raise UnreadableMessageError(f"{type(err).__name__}: {err}") from err

    def close(self) -> None:
        self._doorbell = None
        self._reader.close()
        if self._writer is not None:
            self._writer.close()
