"""The checks over what a scripted node saw on the wire.

Owns one function per check a scenario can name in a ``wire`` step; each
reads the scripted node's log (connections opened and closed, lines in and
out, each with its time and connection) and returns None when the check
holds, or why it does not. Times are compared in milliseconds.

Checks (parameters beside ``check`` in the step):

- ``open_conns`` (``eq``/``ge``...: a matcher): connections open now; polled
  until it holds or ``within_ms`` (default 4000) passes;
- ``accepted``: connections accepted so far;
- ``requests`` (``op``, ``key``, ``count``, ``distinct_conns``): request
  lines of that op (and key);
- ``spread`` (``op``, ``key``, ``conns``, ``min_per_conn``): how the
  matching requests were spread over connections (round-robin);
- ``reconnect_gap`` (``nth`` close by the node, or ``after: "refuse"``,
  ``gap_ms``): time from the node dropping connections to the next
  connection accepted;
- ``sent_after_open`` (``op``, ``key``, ``nth``, ``gap_ms``): time from the
  newest connection accepted before the n-th matching request to it (a
  retry that waited for a connection goes out as soon as one is up);
- ``late_grant_released`` (``key``, ``gap_ms``): the node's newest grant
  of ``key`` was released with its token, that long after it was written;
- ``after_grant`` (``key``, ``op``, ``gap_ms``): a request of ``op`` with the
  token of the node's newest grant of ``key`` followed it that soon (a
  grant that waited is confirmed with ``K``);
- ``granted`` (``key``, ``token``): the node's newest grant of ``key``
  carries that token (so a client matched an answer to the right request);
- ``gaps`` (``op``, ``key``, ``gap_ms``): every gap between two matching
  requests in a row;
- ``closes`` (``by``: ``client`` or ``node``, ``count``): connections closed
  so far by that side;
- ``quiet`` (``op``, ``key``, ``for_ms``): no such request comes for that
  long (a keep-alive stopped; the one check that waits by design);
- ``first_lines`` (``op``, ``line``): every connection's first line is that
  op (that line): ``U <secret>`` before anything else.

Any check given ``within_ms`` is tried again until it holds or that time
passes (``open_conns`` always is, for 4 s by default).

Never does: wait without a bound.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from .matching import mismatch
from .scripted import ScriptedNode

Log = list[dict[str, Any]]


def _requests(log: Log, op: str | None, key: str | None) -> Log:
    out = []
    for e in log:
        if e["kind"] != "in":
            continue
        f = e["line"].split(" ")
        if op is not None and f[0] != op:
            continue
        if key is not None and (len(f) < 2 or f[1] != key):
            continue
        out.append(e)
    return out


def _ms(a: float, b: float) -> int:
    return round((b - a) * 1000)


def open_conns(node: ScriptedNode, p: dict[str, Any]) -> str | None:
    deadline = time.monotonic() + p.get("within_ms", 4000) / 1000
    while True:
        n = node.open_conns()
        why = mismatch(p["count"], n, "open connections")
        if why is None or time.monotonic() >= deadline:
            return why
        time.sleep(0.02)


def accepted(node: ScriptedNode, p: dict[str, Any]) -> str | None:
    n = sum(1 for e in node.wire() if e["kind"] == "open")
    return mismatch(p["count"], n, "connections accepted")


def requests(node: ScriptedNode, p: dict[str, Any]) -> str | None:
    reqs = _requests(node.wire(), p.get("op"), p.get("key"))
    if "count" in p:
        why = mismatch(p["count"], len(reqs), f"{p.get('op')} requests")
        if why:
            return why
    if "distinct_conns" in p:
        return mismatch(p["distinct_conns"], len({e["conn"] for e in reqs}), "their connections")
    return None


def spread(node: ScriptedNode, p: dict[str, Any]) -> str | None:
    reqs = _requests(node.wire(), p.get("op"), p.get("key"))
    per: dict[int, int] = {}
    for e in reqs:
        per[e["conn"]] = per.get(e["conn"], 0) + 1
    why = mismatch(p.get("conns", {"any": True}), len(per), "connections used")
    if why:
        return f"{why} (per connection: {per})"
    least = min(per.values(), default=0)
    if least < p.get("min_per_conn", 0):
        return f"a connection carried only {least} of {len(reqs)} (per connection: {per})"
    return None


def reconnect_gap(node: ScriptedNode, p: dict[str, Any]) -> str | None:
    log = node.wire()
    if p.get("after") == "refuse":
        marks = [e for e in log if e["kind"] == "refuse"]
    else:
        marks = [e for e in log if e["kind"] == "close" and e["line"] == "node"]
    nth = p.get("nth", 1)
    if len(marks) < nth:
        return f"only {len(marks)} drops by the node"
    t0 = marks[nth - 1]["t"]
    opens = [e for e in log if e["kind"] == "open" and e["t"] > t0]
    if not opens:
        return "no connection came back"
    return mismatch(p["gap_ms"], _ms(t0, opens[0]["t"]), "reconnect gap (ms)")


def sent_after_open(node: ScriptedNode, p: dict[str, Any]) -> str | None:
    log = node.wire()
    reqs = _requests(log, p.get("op"), p.get("key"))
    nth = p.get("nth", 1)
    if len(reqs) < nth:
        return f"only {len(reqs)} matching requests"
    req = reqs[nth - 1]
    opens = [e for e in log if e["kind"] == "open" and e["t"] <= req["t"]]
    if not opens:
        return "no connection before it"
    return mismatch(p["gap_ms"], _ms(opens[-1]["t"], req["t"]), "time from connect to request (ms)")


def _newest_grant(log: Log, key: str) -> dict[str, Any] | None:
    for e in reversed(log):
        if e["kind"] == "out" and e["line"].startswith("A "):
            f = e["line"].split(" ")
            if len(f) >= 3 and f[2] == key:
                return e
    return None


def late_grant_released(node: ScriptedNode, p: dict[str, Any]) -> str | None:
    deadline = time.monotonic() + p.get("within_ms", 3000) / 1000
    while True:
        log = node.wire()
        grant = _newest_grant(log, p["key"])
        if grant is not None:
            token = grant["line"].split(" ")[1]
            rel = [e for e in _requests(log, "R", p["key"]) if e["line"].split(" ")[2:3] == [token]
                   and e["t"] >= grant["t"]]
            if rel:
                return mismatch(p["gap_ms"], _ms(grant["t"], rel[0]["t"]), "grant to its release (ms)")
        if time.monotonic() >= deadline:
            if grant is None:
                return f"the node granted {p['key']} to nobody"
            return f"the late grant {token} of {p['key']} was never released"
        time.sleep(0.02)


def after_grant(node: ScriptedNode, p: dict[str, Any]) -> str | None:
    log = node.wire()
    grant = _newest_grant(log, p["key"])
    if grant is None:
        return f"the node granted {p['key']} to nobody"
    token = grant["line"].split(" ")[1]
    follow = [e for e in _requests(log, p["op"], p["key"]) if e["line"].split(" ")[2:3] == [token]
              and e["t"] >= grant["t"]]
    if not follow:
        return f"no {p['op']} {p['key']} {token} after the grant"
    return mismatch(p["gap_ms"], _ms(grant["t"], follow[0]["t"]), f"grant to its {p['op']} (ms)")


def granted(node: ScriptedNode, p: dict[str, Any]) -> str | None:
    grant = _newest_grant(node.wire(), p["key"])
    if grant is None:
        return f"the node granted {p['key']} to nobody"
    return mismatch(p["token"], grant["line"].split(" ")[1], f"token the node granted for {p['key']}")


def gaps(node: ScriptedNode, p: dict[str, Any]) -> str | None:
    reqs = _requests(node.wire(), p.get("op"), p.get("key"))
    for a, b in zip(reqs, reqs[1:]):
        why = mismatch(p["gap_ms"], _ms(a["t"], b["t"]), "gap between requests (ms)")
        if why:
            return why
    return None


def first_lines(node: ScriptedNode, p: dict[str, Any]) -> str | None:
    log = node.wire()
    firsts: dict[int, str] = {}
    for e in log:
        if e["kind"] == "in" and e["conn"] not in firsts:
            firsts[e["conn"]] = e["line"]
    if not firsts:
        return "no connection sent anything"
    for conn, line in firsts.items():
        if line.split(" ")[0] != p["op"]:
            return f"connection {conn} began with {line!r}, not {p['op']}"
        if "line" in p and line != p["line"]:
            return f"connection {conn} began with {line!r}, not {p['line']!r}"
    return None


def closes(node: ScriptedNode, p: dict[str, Any]) -> str | None:
    n = sum(1 for e in node.wire() if e["kind"] == "close" and e["line"] == p["by"])
    return mismatch(p["count"], n, f"connections closed by the {p['by']}")


def quiet(node: ScriptedNode, p: dict[str, Any]) -> str | None:
    """No matching request comes for ``for_ms`` from now (a keep-alive that stopped)."""
    start = time.monotonic()
    time.sleep(p["for_ms"] / 1000)
    late = [e for e in _requests(node.wire(), p.get("op"), p.get("key")) if e["t"] >= start]
    return f"{len(late)} {p.get('op')} requests came: {late[0]['line']!r}" if late else None


CHECKS: dict[str, Callable[[ScriptedNode, dict[str, Any]], str | None]] = {
    "open_conns": open_conns,
    "accepted": accepted,
    "requests": requests,
    "spread": spread,
    "reconnect_gap": reconnect_gap,
    "sent_after_open": sent_after_open,
    "late_grant_released": late_grant_released,
    "granted": granted,
    "after_grant": after_grant,
    "gaps": gaps,
    "first_lines": first_lines,
    "closes": closes,
    "quiet": quiet,
}
