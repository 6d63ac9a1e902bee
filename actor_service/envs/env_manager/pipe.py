"""Length-prefixed pickled messages over one end of a duplex pipe, with as few system calls as possible."""

from __future__ import annotations

import os
import pickle
import struct
from multiprocessing.connection import Connection
from typing import Any

_PROTOCOL = pickle.HIGHEST_PROTOCOL


class MessagePipe:
    """One end of a duplex pipe carrying length-prefixed pickles.

    A receive reads whatever has arrived in one system call (possibly several queued messages), where
    multiprocessing's Connection makes two per message; on these machines a system call is several
    microseconds, a noticeable part of a light env's step.
    """

    _HEADER = struct.Struct("<I")

    def __init__(self, conn: Connection) -> None:
        self._conn = conn  # owns the file descriptor
        self._fd = conn.fileno()
        self._buffer = bytearray()

    def fileno(self) -> int:
        return self._fd

    def send(self, message: Any) -> None:
        data = pickle.dumps(message, _PROTOCOL)
        frame = self._HEADER.pack(len(data)) + data
        written = os.write(self._fd, frame)
        if written < len(frame):  # a large message: the rest as the reader makes room
            view = memoryview(frame)[written:]
            while view:
                view = view[os.write(self._fd, view) :]

    def has_message(self) -> bool:
        """Whether a whole message is already buffered (then `recv` does not block)."""
        buffer = self._buffer
        return len(buffer) >= 4 and len(buffer) >= 4 + self._HEADER.unpack_from(buffer)[0]

    def poll(self) -> bool:
        """Whether `recv` would return without blocking (or raise EOFError)."""
        return self.has_message() or self._conn.poll(0)

    def recv(self) -> Any:
        """The next message; blocks until it has arrived. EOFError once the other end is closed."""
        if not self._buffer:  # the usual case: exactly one message arrives in one read
            chunk = os.read(self._fd, 1 << 16)
            if not chunk:
                raise EOFError("the other end of the pipe is closed")
            if len(chunk) >= 4 and len(chunk) == 4 + self._HEADER.unpack_from(chunk)[0]:
                return pickle.loads(memoryview(chunk)[4:])
            self._buffer += chunk
        while not self.has_message():
            chunk = os.read(self._fd, 1 << 16)
            if not chunk:
                raise EOFError("the other end of the pipe is closed")
            self._buffer += chunk
        size = self._HEADER.unpack_from(self._buffer)[0]
        data = bytes(self._buffer[4 : 4 + size])
        del self._buffer[: 4 + size]
        return pickle.loads(data)

    def close(self) -> None:
        self._conn.close()
