"""One driver process: the client under test, spoken to in JSON lines.

Owns the process (started from the repository root with its ``run``
command, stopped by PID), a reader thread that files each line it writes
(answers by ``id``, events in arrival order), and the driver's stderr in a
log file that a failure report shows.

Never does: interpret a result (that is ``scenario``), or wait without a
deadline: every wait here has one, and a driver that breaks the protocol (a
line that is not JSON, an answer twice, an unknown id) is recorded as a
protocol error that fails the scenario.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any

READY_TIMEOUT_S = 60.0
EXIT_TIMEOUT_S = 3.0


class DriverError(Exception):
    """The driver broke the driver protocol, died, or did not answer in time."""


@dataclass
class Event:
    at: float
    body: dict[str, Any]


@dataclass
class _State:
    answers: dict[int, tuple[float, dict[str, Any]]] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    protocol_errors: list[str] = field(default_factory=list)
    closed: bool = False


class Driver:
    """A running driver. ``send`` returns a request id; ``wait_answer`` its answer."""

    def __init__(self, name: str, argv: list[str], root: str, log_path: str) -> None:
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            argv,
            cwd=root,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            start_new_session=True,
        )
        self._cond = threading.Condition()
        self._state = _State()
        self._next_id = 1
        self._sent_ids: set[int] = set()
        self._write_lock = threading.Lock()
        self.ready: dict[str, Any] | None = None
        self._reader = threading.Thread(target=self._read, name=f"driver-{name}", daemon=True)
        self._reader.start()
        self._wait_ready()

    # -- reading ---------------------------------------------------------

    def _read(self) -> None:
        assert self.proc.stdout is not None
        first = True
        for raw in self.proc.stdout:
            now = time.monotonic()
            try:
                body = json.loads(raw)
                if not isinstance(body, dict):
                    raise ValueError("not an object")
            except ValueError:
                with self._cond:
                    self._state.protocol_errors.append(f"not a JSON object: {raw[:200]!r}")
                    self._cond.notify_all()
                continue
            with self._cond:
                if first:
                    first = False
                    if body.get("ready") is True:
                        self.ready = body
                    else:
                        self._state.protocol_errors.append(f"first line is not ready: {body}")
                elif "id" in body and body["id"] is None:
                    pass  # a line the driver could not read at all: said, not answered
                elif "id" in body:
                    self._file_answer(now, body)
                elif "event" in body:
                    self._state.events.append(Event(now, body))
                else:
                    self._state.protocol_errors.append(f"neither an answer nor an event: {body}")
                self._cond.notify_all()
        with self._cond:
            self._state.closed = True
            self._cond.notify_all()

    def _file_answer(self, now: float, body: dict[str, Any]) -> None:
        rid = body.get("id")
        if not isinstance(rid, int) or rid not in self._sent_ids:
            self._state.protocol_errors.append(f"answer to an id never sent: {body}")
        elif rid in self._state.answers:
            self._state.protocol_errors.append(f"a second answer to id {rid}: {body}")
        elif ("ok" in body) == ("error" in body):
            self._state.protocol_errors.append(f"an answer needs exactly one of ok/error: {body}")
        elif "error" in body and not _is_error(body["error"]):
            self._state.protocol_errors.append(f"an error needs a kind and a detail: {body}")
        else:
            self._state.answers[rid] = (now, body)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        with self._cond:
            while self.ready is None:
                if self._state.protocol_errors:
                    raise DriverError(self._state.protocol_errors[0])
                if self._state.closed:
                    raise DriverError("the driver exited before it was ready")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DriverError("the driver did not say ready in time")
                self._cond.wait(left)

    # -- writing ---------------------------------------------------------

    def send(self, request: dict[str, Any]) -> int:
        """Write a request with a fresh id; returns the id."""
        with self._write_lock:
            rid = self._next_id
            self._next_id += 1
            with self._cond:
                self._sent_ids.add(rid)
            line = json.dumps({"id": rid, **request}) + "\n"
            self.send_raw(line)
            return rid

    def send_raw(self, line: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(line.encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise DriverError(f"the driver's stdin is closed: {e}") from e

    def expect_id(self, rid: int) -> None:
        """Accept an answer to an id sent with ``send_raw``."""
        with self._cond:
            self._sent_ids.add(rid)

    # -- waiting ---------------------------------------------------------

    def wait_answer(self, rid: int, timeout_s: float) -> tuple[float, dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while rid not in self._state.answers:
                self._raise_protocol_error()
                if self._state.closed:
                    raise DriverError(f"the driver exited before answering request {rid}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DriverError(f"no answer to request {rid} within {timeout_s:.1f} s")
                self._cond.wait(left)
            return self._state.answers[rid]

    def answered(self, rid: int) -> bool:
        with self._cond:
            return rid in self._state.answers

    def wait_event(self, pred: Any, start: int, timeout_s: float) -> tuple[int, Event] | None:
        """The first event from index ``start`` on that ``pred(index, body)`` accepts, in time."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                self._raise_protocol_error()
                events = self._state.events
                for i in range(start, len(events)):
                    if pred(i, events[i].body):
                        return i, events[i]
                start = max(start, len(events))
                left = deadline - time.monotonic()
                if left <= 0 or self._state.closed:
                    return None
                self._cond.wait(left)

    def events(self) -> list[Event]:
        with self._cond:
            return list(self._state.events)

    def _raise_protocol_error(self) -> None:
        if self._state.protocol_errors:
            raise DriverError("driver protocol: " + self._state.protocol_errors[0])

    def protocol_errors(self) -> list[str]:
        with self._cond:
            return list(self._state.protocol_errors)

    # -- stopping --------------------------------------------------------

    def stop(self) -> int | None:
        """Ask the driver to exit (``exit``, then the end of stdin); kill it if it lingers.

        Returns its exit code, or None when it had to be killed.
        """
        code: int | None = None
        try:
            if self.proc.poll() is None:
                try:
                    self.send({"cmd": "exit"})
                except DriverError:
                    pass
                try:
                    assert self.proc.stdin is not None
                    self.proc.stdin.close()
                except OSError:
                    pass
                try:
                    code = self.proc.wait(EXIT_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    code = None
            else:
                code = self.proc.returncode
        finally:
            # Whatever the driver started in its session goes with it.
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.proc.wait()
            self._reader.join(2)
            self._log.close()
        return code

    def stderr_tail(self, limit: int = 4000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                data = f.read()
        except OSError:
            return ""
        return data[-limit:].decode(errors="replace")


def _is_error(err: Any) -> bool:
    return isinstance(err, dict) and isinstance(err.get("kind"), str) and "detail" in err
