"""A small fake baton server for tests that need a server misbehaving, or
speaking parts of the protocol exactly as a test says."""

import socket
import threading

from conftest import DEADLINE


class FakeServer:
    """Accepts connections; ``handle(conn_index, line)`` returns the answer
    line(s) to send, ``b""`` to send nothing yet, or None to close that
    connection without answering."""

    def __init__(self, handle):
        self.handle = handle
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.addr = "127.0.0.1:%d" % self.sock.getsockname()[1]
        self.lines = []
        self._conns = []
        self._send_lock = threading.Lock()  # whole lines, never interleaved
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        index = 0
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn, index), daemon=True).start()
            index += 1

    def _serve(self, conn, index):
        buf = b""
        with conn:
            conn.settimeout(DEADLINE)
            while True:
                try:
                    chunk = conn.recv(4096)
                except OSError:
                    return
                if not chunk:
                    return
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    self.lines.append((index, line))
                    answer = self.handle(index, line)
                    if answer is None:
                        return
                    if answer:
                        try:
                            with self._send_lock:
                                conn.sendall(answer + b"\n")
                        except OSError:
                            return  # the client went away (a broken pipe is no error here)

    def send(self, index, data):
        """Send ``data`` (a line without its ending) on connection ``index``
        unasked, as a server pushes a watch's state lines."""
        try:
            with self._send_lock:
                self._conns[index].sendall(data + b"\n")
        except OSError:
            pass  # the client went away

    def drop(self, index):
        """Close connection ``index`` (the client sees it end)."""
        try:
            self._conns[index].shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def sent(self, prefix):
        """The lines received that start with ``prefix``, as (conn, line)."""
        return [(i, line) for i, line in list(self.lines) if line.startswith(prefix)]

    def close(self):
        self._stop = True
        self.sock.close()
        for conn in self._conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
