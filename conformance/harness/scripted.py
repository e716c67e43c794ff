"""The scripted node: a small lock server of the runner's own that misbehaves on cue.

Owns: a listening socket on 127.0.0.1, its client connections, a lock
table that keeps the contract's rules for what the scenarios use (acquire
with limit and value, FIFO lines with wait deadlines, leases that run out,
release, keep, query, info, watch and unwatch, ``U`` authentication), the
fault rules a scenario gives it, and the wire log: every connection opened
and closed and every line in and out, with the time.

Faults, each a rule ``{"on": {...}, "do": ...}`` matched against request
lines (``op``, optional ``key``, ``nth`` match, ``every`` match from then
on, ``conn``: the n-th connection accepted, from 1):

- ``drop``: close the connection at once, the request unprocessed;
- ``process_drop``: process the request, then close the connection
  without answering (so a retry meets what the first attempt did);
- ``stall``: never process nor answer that request (other requests on the
  connection are served);
- ``stall_conn``: from that request on, read nothing more on the
  connection and answer nothing (a hung node);
- ``{"reply": LINE}``: answer LINE instead of processing;
- ``{"delay_ms": N}``: process now, write the answer N ms later (answers
  to later requests go out first: out of order);
- ``{"hold_answers": N}``: process this request and the next N-1 on its
  connection, then write their answers in reverse order.

Modes: ``refuse(ms)`` closes the listener and every connection, and
listens again after ``ms`` (connects meanwhile are refused);
``redirect(addr)`` answers every request but ``I`` and ``U`` with
``M <addr> <op> <key>`` (``-`` for no active known) until cleared.

Runs its own asyncio loop on a thread of its own; the runner calls the
thread-safe methods. Tokens start above 2^63 (``TOKEN_BASE``), so every
scenario against it checks that a client carries them exactly.

Never does: connect anywhere, or grow without bound (its memory is the
scenario's few keys and its wire log, which ends with the scenario).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

TOKEN_BASE = 2**63 + 1_000_003
MAX_LINE = 1024


@dataclass
class Holder:
    token: int
    slot: int
    value: str | None
    expiry: asyncio.TimerHandle | None = None


@dataclass
class Waiter:
    conn: "Conn"
    key: str
    lease_s: float
    value: str | None
    deadline: asyncio.TimerHandle | None = None
    done: bool = False


@dataclass
class KeyState:
    limit: int
    holders: dict[int, Holder] = field(default_factory=dict)
    line: deque[Waiter] = field(default_factory=deque)


@dataclass
class Conn:
    cid: int
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    authed: bool
    stalled: bool = False
    closed: bool = False
    watches: set[str] = field(default_factory=set)
    held_back: list[str] | None = None
    held_left: int = 0


class ScriptedNode:
    def __init__(self, name: str, port: int, auth: str | None = None) -> None:
        self.name = name
        self.port = port
        self.auth = auth
        self.log: list[dict[str, Any]] = []
        self.rules: list[dict[str, Any]] = []
        self._matches: list[int] = []
        self._redirect: str | None = None
        self._keys: dict[str, KeyState] = {}
        self._conns: dict[int, Conn] = {}
        self._next_cid = 1
        self._next_token = TOKEN_BASE
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Future[None]] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"scripted-{name}", daemon=True)
        self._thread.start()
        self._call(self._listen())

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    # -- the runner's side (thread-safe) -------------------------------------

    def _call(self, coro: Any, timeout_s: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def add_rules(self, rules: list[dict[str, Any]]) -> None:
        async def add() -> None:
            for rule in rules:
                self.rules.append(rule)
                self._matches.append(0)

        self._call(add())

    def refuse(self, ms: int) -> None:
        self._call(self._refuse(ms))

    def redirect(self, addr: str | None) -> None:
        async def set_mode() -> None:
            self._redirect = addr

        self._call(set_mode())

    def wire(self) -> list[dict[str, Any]]:
        async def copy() -> list[dict[str, Any]]:
            return [dict(e) for e in self.log]

        result: list[dict[str, Any]] = self._call(copy())
        return result

    def open_conns(self) -> int:
        async def count() -> int:
            return self._open_count()

        result: int = self._call(count())
        return result

    def token_of(self, key: str) -> list[int]:
        """Tokens granted for ``key`` so far, in order (from the wire log)."""
        out = []
        for e in self.wire():
            if e["kind"] == "out" and e["line"].startswith("A "):
                parts = e["line"].split(" ")
                if len(parts) >= 3 and parts[2] == key:
                    out.append(int(parts[1]))
        return out

    def close(self) -> None:
        async def shut() -> None:
            for task in self._tasks:
                task.cancel()
            if self._server is not None:
                self._server.close()
            for conn in list(self._conns.values()):
                self._close_conn(conn, "node")
            for st in self._keys.values():
                for h in st.holders.values():
                    if h.expiry:
                        h.expiry.cancel()
                for w in st.line:
                    if w.deadline:
                        w.deadline.cancel()

        try:
            self._call(shut())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)

    # -- listening -------------------------------------------------------------

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(
            self._serve, "127.0.0.1", self.port, reuse_address=True, limit=MAX_LINE * 4
        )

    async def _refuse(self, ms: int) -> None:
        self._record(0, "refuse", f"{ms}")
        if self._server is not None:
            self._server.close()
            self._server = None
        for conn in list(self._conns.values()):
            self._close_conn(conn, "node")

        async def reopen() -> None:
            await asyncio.sleep(ms / 1000)
            await self._listen()
            self._record(0, "listen", "")

        self._tasks.add(asyncio.ensure_future(reopen()))

    def _open_count(self) -> int:
        return sum(1 for c in self._conns.values() if not c.closed)

    def _record(self, cid: int, kind: str, line: str) -> None:
        self.log.append({"t": time.monotonic(), "conn": cid, "kind": kind, "line": line})

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._server is None:
            writer.close()
            return
        cid = self._next_cid
        self._next_cid += 1
        conn = Conn(cid, reader, writer, authed=self.auth is None)
        self._conns[cid] = conn
        self._record(cid, "open", "")
        try:
            while not conn.closed:
                try:
                    raw = await reader.readuntil(b"\n")
                except asyncio.IncompleteReadError:
                    break
                except asyncio.LimitOverrunError:
                    self._write(conn, "E - - line-too-long")
                    break
                except (ConnectionError, OSError):
                    break
                if conn.stalled:
                    continue
                line = raw.decode(errors="replace").rstrip("\r\n")
                self._record(cid, "in", line)
                self._handle(conn, line)
        finally:
            self._close_conn(conn, "client")

    def _close_conn(self, conn: Conn, by: str) -> None:
        if conn.closed:
            return
        conn.closed = True
        self._record(conn.cid, "close", by)
        try:
            conn.writer.close()
        except (ConnectionError, OSError, RuntimeError):
            pass
        for st in self._keys.values():
            for w in st.line:
                if w.conn is conn and not w.done:
                    w.done = True
                    if w.deadline:
                        w.deadline.cancel()
        for key in list(self._keys):
            self._tidy(key)

    def _write(self, conn: Conn, line: str) -> None:
        if conn.closed:
            return
        if conn.held_back is not None:
            conn.held_back.append(line)
            return
        self._record(conn.cid, "out", line)
        try:
            conn.writer.write((line + "\n").encode())
        except (ConnectionError, OSError, RuntimeError):
            self._close_conn(conn, "client")

    # -- faults ----------------------------------------------------------------

    def _rule_for(self, conn: Conn, op: str, key: str) -> Any:
        """The action of the first rule that fires on this request; every rule counts it."""
        action = None
        for i, rule in enumerate(self.rules):
            on = rule.get("on", {})
            if on.get("op", op) != op or on.get("key", key) != key:
                continue
            if "conn" in on and on["conn"] != conn.cid:
                continue
            self._matches[i] += 1
            n = self._matches[i]
            nth = int(on.get("nth", 1))
            if action is None and (n == nth or (on.get("every") and n >= nth)):
                action = rule["do"]
        return action

    def _handle(self, conn: Conn, line: str) -> None:
        fields = line.split(" ")
        op = fields[0]
        key = fields[1] if len(fields) > 1 and op not in ("I", "U") else "-"
        if not conn.authed:
            if op == "U" and len(fields) == 2 and fields[1] == self.auth:
                conn.authed = True
                self._write(conn, "U ok")
            else:
                self._write(conn, "E - - bad-auth" if op == "U" else "E - - auth-required")
                self._close_conn(conn, "node")
            return
        action = self._rule_for(conn, op, key) if op not in ("U",) else None
        if action == "drop":
            self._close_conn(conn, "node")
            return
        if action == "stall":
            return
        if action == "stall_conn":
            conn.stalled = True
            return
        if isinstance(action, dict) and "reply" in action:
            self._write(conn, str(action["reply"]))
            return
        if isinstance(action, dict) and "hold_answers" in action and conn.held_back is None:
            conn.held_back = []
            conn.held_left = int(action["hold_answers"])
        if action == "process_drop":
            conn.held_back = []
            self._process(conn, op, key, fields)
            conn.held_back = None
            self._close_conn(conn, "node")
            return
        if isinstance(action, dict) and "delay_ms" in action:
            saved = conn.held_back
            conn.held_back = []
            self._process(conn, op, key, fields)
            lines, conn.held_back = conn.held_back, saved
            delay = int(action["delay_ms"]) / 1000
            for out in lines:
                self._loop.call_later(delay, self._write, conn, out)
            return
        self._process(conn, op, key, fields)
        if conn.held_back is not None and conn.held_left > 0:
            conn.held_left -= 1
            if conn.held_left == 0:
                lines, conn.held_back = conn.held_back, None
                for out in reversed(lines):
                    self._write(conn, out)

    # -- the lock table ----------------------------------------------------------

    def _process(self, conn: Conn, op: str, key: str, f: list[str]) -> None:
        if op == "U":
            self._write(conn, "U ok" if self.auth else "E U - auth-disabled")
            return
        if op == "I":
            self._write(conn, self._info())
            return
        if self._redirect is not None and op in ("A", "R", "K", "Q", "W", "X"):
            self._write(conn, f"M {self._redirect} {op} {key}")
            return
        try:
            if op == "A" and 4 <= len(f) <= 6:
                limit = int(f[4]) if len(f) > 4 else 1
                value = f[5] if len(f) > 5 else None
                self._acquire(conn, key, float(f[2]), float(f[3]), limit, value)
            elif op == "R" and len(f) == 3:
                self._release(conn, key, int(f[2]))
            elif op == "K" and len(f) == 4:
                self._keep(conn, key, int(f[2]), float(f[3]))
            elif op == "Q" and len(f) == 2:
                self._query(conn, key)
            elif op == "W" and len(f) == 2:
                conn.watches.add(key)
                self._write(conn, self._watch_line(key))
            elif op == "X" and len(f) == 2:
                conn.watches.discard(key)
                self._write(conn, f"X {key}")
            else:
                self._write(conn, "E - - missing-fields" if op in {"A", "R", "K", "Q", "W", "X"} else "E - - unknown-op")
                self._close_conn(conn, "node")
        except ValueError:
            self._write(conn, f"E {op} {key} bad-request")

    def _info(self) -> str:
        held = sum(len(s.holders) for s in self._keys.values())
        waiting = sum(sum(1 for w in s.line if not w.done) for s in self._keys.values())
        role = "standby" if self._redirect is not None else "active"
        active = self._redirect if self._redirect is not None else self.addr
        return (f"I role={role} node={self.addr} active={active} token={self._next_token - 1} "
                f"held={held} waiting={waiting} conns={self._open_count()}")

    def _acquire(self, conn: Conn, key: str, lease: float, wait: float, limit: int, value: str | None) -> None:
        st = self._keys.get(key)
        if st is None or (not st.holders and not any(not w.done for w in st.line)):
            st = KeyState(limit)
            self._keys[key] = st
        elif st.limit != limit:
            self._write(conn, f"E A {key} limit-mismatch")
            return
        if len(st.holders) < st.limit and not any(not w.done for w in st.line):
            self._grant(conn, key, st, lease, value, self._free_slot(st))
            return
        waiter = Waiter(conn, key, lease, value)
        if wait > 0:
            waiter.deadline = self._loop.call_later(wait, self._timeout, waiter)
        st.line.append(waiter)
        self._notify(key)

    def _free_slot(self, st: KeyState) -> int:
        used = {h.slot for h in st.holders.values()}
        return next(i for i in range(st.limit) if i not in used)

    def _grant(self, conn: Conn, key: str, st: KeyState, lease: float, value: str | None, slot: int) -> None:
        token = self._next_token
        self._next_token += 1
        h = Holder(token, slot, value)
        h.expiry = self._loop.call_later(lease, self._expire, key, token)
        st.holders[token] = h
        self._write(conn, f"A {token} {key} {slot}" if st.limit > 1 else f"A {token} {key}")
        self._notify(key)

    def _timeout(self, waiter: Waiter) -> None:
        if waiter.done:
            return
        waiter.done = True
        self._write(waiter.conn, f"T {waiter.key}")
        self._tidy(waiter.key)
        self._notify(waiter.key)

    def _expire(self, key: str, token: int) -> None:
        st = self._keys.get(key)
        if st is None or token not in st.holders:
            return
        self._free(key, st, token)

    def _free(self, key: str, st: KeyState, token: int) -> None:
        h = st.holders.pop(token)
        if h.expiry:
            h.expiry.cancel()
        while st.line:
            w = st.line.popleft()
            if w.done or w.conn.closed:
                continue
            w.done = True
            if w.deadline:
                w.deadline.cancel()
            self._grant(w.conn, key, st, w.lease_s, w.value, h.slot)
            return
        self._notify(key)
        self._tidy(key)

    def _tidy(self, key: str) -> None:
        st = self._keys.get(key)
        if st is None:
            return
        while st.line and (st.line[0].done or st.line[0].conn.closed):
            st.line.popleft()

    def _release(self, conn: Conn, key: str, token: int) -> None:
        st = self._keys.get(key)
        if st is None or token not in st.holders:
            self._write(conn, f"N {key}")
            return
        self._write(conn, f"R {key}")
        self._free(key, st, token)

    def _keep(self, conn: Conn, key: str, token: int, lease: float) -> None:
        st = self._keys.get(key)
        h = st.holders.get(token) if st else None
        if h is None:
            self._write(conn, f"E K {key} not-held")
            return
        if h.expiry:
            h.expiry.cancel()
        h.expiry = self._loop.call_later(lease, self._expire, key, token)
        self._write(conn, f"K {key}")

    def _query(self, conn: Conn, key: str) -> None:
        st = self._keys.get(key)
        if st is None or not st.holders:
            waiting = sum(1 for w in st.line if not w.done) if st else 0
            self._write(conn, f"Q {key} 0 0 {waiting}")
            return
        token = max(st.holders)
        h = st.holders[token]
        left = max(0, int(((h.expiry.when() if h.expiry else 0) - self._loop.time()) * 1000))
        waiting = sum(1 for w in st.line if not w.done)
        self._write(conn, f"Q {key} {token} {left} {waiting}")

    def _watch_line(self, key: str) -> str:
        st = self._keys.get(key)
        if st is None or not st.holders:
            waiting = sum(1 for w in st.line if not w.done) if st else 0
            return f"W {key} 0 0 {waiting} -"
        token = max(st.holders)
        value = st.holders[token].value or "-"
        waiting = sum(1 for w in st.line if not w.done)
        return f"W {key} {token} {len(st.holders)} {waiting} {value}"

    def _notify(self, key: str) -> None:
        line = self._watch_line(key)
        for conn in list(self._conns.values()):
            if key in conn.watches and not conn.closed:
                self._write(conn, line)
