"""What one connection waits for, and which request or watch an answer
belongs to: shared by the blocking connections (``_pool.py``, under their
lock) and the asyncio ones (``_apool.py``, on the loop). Pure data, no I/O.

Owns: per (op, key), the slots of the requests sent and not answered yet,
in send order (the server answers requests with the same (op, key) on one
connection in the order they came, so an answer goes to the oldest); per
key, the sinks of the ``W`` requests sent and not ended yet, oldest first
(an ``X``, ``M`` or ``E`` answer ends the oldest, a ``W`` line goes to it);
and the rule that a grant nobody waits for any more is released at once
(so is one that comes while the client closes: its call fails ``Closed``).

Held-back answers: only the oldest request of an (op, key) can be answered
next (the server holds back the answer to a later acquire of a key on a
connection, even a ``T`` whose wait ran out, until the earlier one is
answered), so each slot's ``front_at`` says when its request reached the
front of its line (None while it waits behind another): a call's overdue
clock runs from then (``_calls.exchange``). ``has`` lets the pool send an
acquire to a connection with none of its key outstanding.

Never does: trust a line: an answer for no request raises ``WireError``,
``E - - reason`` raises ``ServerClosing`` (the server closes the
connection after it).
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Callable, DefaultDict, Deque, Dict, List, Optional, Tuple

from . import _wire
from ._wire import Answer, Route

#: The most requests waiting for an answer on one connection.
MAX_IN_FLIGHT = 65536


class ServerClosing(OSError):
    """``E - - <reason>``: the server refused the line (or the connection)
    and closes it."""

    def __init__(self, reason: str) -> None:
        super().__init__("refused by the server: %s" % reason)
        self.reason = reason


#: ``E - - <reason>`` words that mean this client's secret is refused.
AUTH_REASONS = ("auth-required", "bad-auth")


class Slot:
    """One request's answer, handed from a connection to its caller: a
    blocking caller waits on an event, an async one registers a callback
    (called on the thread or loop that delivers the answer)."""

    __slots__ = (
        "_lock",
        "_event",
        "answer",
        "lost",
        "closed",
        "_abandoned",
        "_callbacks",
        "front_at",
        "sent_at",
    )

    def __init__(self) -> None:
        #: When its request is sent (made just before): a request sent at
        #: the front of its line can be answered from then on.
        self.sent_at = time.monotonic()
        #: When the request reached the front of its (op, key) line on its
        #: connection (``time.monotonic()``); None while it is held back
        #: behind an earlier one. Set by the connection (one float store).
        self.front_at: Optional[float] = None
        self._lock = threading.Lock()
        self._event: Optional[threading.Lock] = None
        self.answer: Optional[Answer] = None
        self.lost = False
        #: The client closed before the answer reached the caller (a grant,
        #: released instead): the call fails ``Closed``. ``lost`` too.
        self.closed = False
        self._abandoned = False
        self._callbacks: Optional[List[Callable[[], None]]] = None

    @property
    def done(self) -> bool:
        return self.answer is not None or self.lost

    def _finish(self) -> Optional[List[Callable[[], None]]]:
        if self._event is not None:
            self._event.release()
        callbacks, self._callbacks = self._callbacks, None
        return callbacks

    def set(self, answer: Answer) -> bool:
        """Hand the answer over; False when the caller had given up."""
        with self._lock:
            if self._abandoned or self.done:
                return False
            self.answer = answer
            callbacks = self._finish()
        if callbacks:
            for callback in callbacks:
                callback()
        return True

    def fail(self, closed: bool = False) -> None:
        """The connection dropped before the answer came (``closed``: the
        client closed, and the answer goes to nobody)."""
        with self._lock:
            if self.done:
                return
            self.lost = True
            self.closed = closed
            callbacks = self._finish()
        if callbacks:
            for callback in callbacks:
                callback()

    def abandon(self) -> Optional[Answer]:
        """The caller gives up; the answer if it came just before."""
        with self._lock:
            self._abandoned = True
            return self.answer

    def wait(self, timeout: Optional[float]) -> bool:
        """Block until done or ``timeout`` seconds pass (None: no limit);
        True when done. The gate is a lock held until the slot is done
        (lighter than an Event)."""
        with self._lock:
            if self.done:
                return True
            if self._event is None:
                gate = threading.Lock()
                gate.acquire()
                self._event = gate
            gate = self._event
        if gate.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            gate.release()  # open for any other waiter
        return self.done

    def add_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the slot is done (at once if it is)."""
        with self._lock:
            if not self.done:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(callback)
                return
        callback()


class WatchSink:
    """Where one ``W <key>`` sent on one connection reports, called by the
    connection (never under its lock): each state line, then once its end:
    the ``X``, ``M`` or ``E`` answer that ends it, or None when the
    connection ended (``why`` says how)."""

    def on_state(self, answer: Answer) -> None:
        pass

    def on_end(self, answer: Optional[Answer], why: str) -> None:
        pass


#: What an answer is for: ``(slot, None, False)`` for a request (the slot
#: None when nobody waits, as for a probe or a release of an unwanted
#: grant), ``(None, sink, ends)`` for a watch, with whether it ends it.
Match = Tuple[Optional[Slot], Optional[WatchSink], bool]


class Pending:
    """The requests and watches outstanding on one connection."""

    __slots__ = ("requests", "watches", "in_flight")

    def __init__(self) -> None:
        self.requests: DefaultDict[Route, Deque[Optional[Slot]]] = collections.defaultdict(
            collections.deque
        )
        self.watches: Dict[bytes, Deque[WatchSink]] = {}
        self.in_flight = 0

    def full(self) -> bool:
        return self.in_flight >= MAX_IN_FLIGHT

    def busy(self) -> bool:
        """Something waits for the server: liveness probes are due when it
        is silent."""
        return self.in_flight > 0 or bool(self.watches)

    def add(self, op: str, key: Optional[bytes], slot: Optional[Slot]) -> None:
        queue = self.requests[(op, key)]
        queue.append(slot)
        self.in_flight += 1
        if slot is not None and len(queue) == 1:
            slot.front_at = slot.sent_at

    def has_op(self, *ops: str) -> bool:
        """A request of one of these ops waits for its answer (for
        closing, not for every call: it looks at every waiting line)."""
        return any(route[0] in ops for route in self.requests)

    def has(self, op: str, key: Optional[bytes]) -> bool:
        """A request with this (op, key) waits for its answer (one dict
        lookup)."""
        return (op, key) in self.requests

    def add_watch(self, key: bytes, sink: WatchSink) -> None:
        self.watches.setdefault(key, collections.deque()).append(sink)

    def watching(self, key: bytes, sink: WatchSink) -> bool:
        queue = self.watches.get(key)
        return queue is not None and sink in queue

    def match(self, answer: Answer) -> Match:
        """Take what ``answer`` is for (see ``Match``). Raises ``WireError`` for an answer
        that answers nothing, ``ServerClosing`` for ``E - -``."""
        route = _wire.route(answer)
        if route is None:
            raise ServerClosing(answer[3])
        op = route[0]
        if op == "W" or op == "X":
            key = b"-" if route[1] is None else route[1]
            watches = self.watches.get(key)
            if not watches:
                raise _wire.WireError("a %s line for a key not watched" % op)
            sink = watches[0]
            ends = answer[0] != _wire.WATCHED
            if ends:
                watches.popleft()
                if not watches:
                    del self.watches[key]
            return (None, sink, ends)
        queue = self.requests.get(route)
        if not queue and route[1] is None and op != "I":
            # `-` names a key that is not allowed, or the key "-".
            route = (op, b"-")
            queue = self.requests.get(route)
        if not queue:
            raise _wire.WireError("an answer for no request")
        slot = queue.popleft()
        if not queue:
            del self.requests[route]
        else:
            # The next one of this (op, key) can be answered from now on.
            following = queue[0]
            if following is not None:
                following.front_at = time.monotonic()
        self.in_flight -= 1
        return (slot, None, False)

    def drain(self) -> Tuple[List[Slot], List[WatchSink]]:
        """The connection ended: every slot and sink still waiting."""
        slots = [s for queue in self.requests.values() for s in queue if s is not None]
        sinks = [s for queue in self.watches.values() for s in queue]
        self.requests.clear()
        self.watches.clear()
        self.in_flight = 0
        return slots, sinks


def hand_over(slot: Optional[Slot], answer: Answer, closing: bool = False) -> Optional[bytes]:
    """Give ``answer`` to its caller; the release line to send when it is
    a grant whose caller gave up (the rule: a late grant is released at
    once, never left held until its lease runs out), or any grant while
    the client is ``closing`` (close ends the call: it fails ``Closed``;
    the key a held key's release hands to this client's own waiter, say)."""
    if slot is None:
        return None
    if closing and answer[0] == _wire.GRANTED:
        slot.fail(closed=True)
    elif slot.set(answer):
        return None
    if answer[0] == _wire.GRANTED:
        line: bytes = _wire.release_line(answer[2], answer[1])
        return line
    return None
