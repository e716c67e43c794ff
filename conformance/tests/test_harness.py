"""Unit tests of the runner's deciding parts: matching, shapes, wire checks, the scripted node.

Run: ``python3 -m unittest discover -s conformance/tests`` (standard library
only; CI runs it before the suite). The scripted node is exercised over a
real loopback socket, as a client would see it.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from harness import scenario, wire  # noqa: E402
from harness.matching import mismatch, resolve  # noqa: E402
from harness.ports import free_ports  # noqa: E402
from harness.scripted import TOKEN_BASE, ScriptedNode  # noqa: E402


class Matching(unittest.TestCase):
    def test_tokens_compare_as_exact_integers(self) -> None:
        big = str(2**64 - 1)
        self.assertIsNone(mismatch({"gt": str(2**63)}, big))
        self.assertIsNotNone(mismatch({"gt": big}, big))
        # 2^53 + 1 is not representable as a float: equal floats would match.
        self.assertIsNotNone(mismatch(str(2**53), str(2**53 + 1)))

    def test_fields_not_named_are_free_and_missing_ones_fail(self) -> None:
        self.assertIsNone(mismatch({"ok": {"slot": 0}}, {"ok": {"slot": 0, "token": "5"}}))
        self.assertIn("missing", mismatch({"ok": {"slot": 0}}, {"ok": {}}) or "")
        self.assertIsNone(mismatch({"value": None}, {"value": None}))
        self.assertIsNotNone(mismatch({"value": None}, {"value": "x"}))

    def test_one_of_any_and_absent(self) -> None:
        self.assertIsNone(mismatch({"one_of": ["a", "b"]}, "b"))
        self.assertIsNotNone(mismatch({"one_of": ["a", "b"]}, "c"))
        self.assertIsNone(mismatch({"x": {"any": True}}, {}))
        self.assertIsNone(mismatch({"x": {"absent": True}}, {}))
        self.assertIsNotNone(mismatch({"x": {"absent": True}}, {"x": 1}))

    def test_references_resolve_at_any_depth(self) -> None:
        saved = {"g1": {"token": "42"}}

        def lookup(path: str) -> object:
            name, _, field = path.partition(".")
            return saved[name][field]

        self.assertEqual(resolve({"a": [{"gt": "$g1.token"}]}, lookup), {"a": [{"gt": "42"}]})


class Shapes(unittest.TestCase):
    def test_a_token_must_be_a_decimal_string(self) -> None:
        ok = {"ok": {"grant": "g", "token": "18446744073709551615", "slot": 0}}
        self.assertIsNone(scenario.shape_error("acquire", ok))
        for bad in (1.5e18, 123, "0x10", "-1", "18446744073709551616", "0"):
            body = {"ok": {"grant": "g", "token": bad, "slot": 0}}
            self.assertIsNotNone(scenario.shape_error("acquire", body), bad)

    def test_error_kinds_come_from_the_fixed_list(self) -> None:
        self.assertIsNone(scenario.shape_error("acquire", {"error": {"kind": "lost", "detail": ""}}))
        self.assertIsNotNone(scenario.shape_error("acquire", {"error": {"kind": "oops", "detail": ""}}))

    def test_state_events(self) -> None:
        good = {"event": "state", "watch": "w", "token": "0", "holders": 0, "waiting": 0, "value": None}
        self.assertIsNone(scenario.event_shape_error(good))
        self.assertIsNotNone(scenario.event_shape_error({**good, "token": 0}))


def _log(*entries: tuple[float, int, str, str]) -> list[dict[str, object]]:
    return [{"t": t, "conn": c, "kind": k, "line": line} for t, c, k, line in entries]


class FakeNode:
    def __init__(self, log: list[dict[str, object]]) -> None:
        self._log = log

    def wire(self) -> list[dict[str, object]]:
        return self._log


class WireChecks(unittest.TestCase):
    def test_spread_needs_every_connection_used(self) -> None:
        log = _log(*[(i, 1 + (i % 2), "in", f"Q k{i}") for i in range(10)])
        self.assertIsNone(wire.spread(FakeNode(log), {"op": "Q", "conns": 2, "min_per_conn": 3}))
        lopsided = _log(*[(i, 1 if i < 9 else 2, "in", f"Q k{i}") for i in range(10)])
        self.assertIsNotNone(wire.spread(FakeNode(lopsided), {"op": "Q", "conns": 2, "min_per_conn": 3}))

    def test_reconnect_gap_is_from_the_refusal_to_the_next_connection(self) -> None:
        log = _log((1.0, 0, "refuse", "300"), (1.2, 1, "close", "node"), (4.1, 3, "open", ""))
        self.assertIsNone(wire.reconnect_gap(FakeNode(log), {"after": "refuse", "gap_ms": {"ge": 2000}}))
        early = _log((1.0, 0, "refuse", "300"), (1.5, 3, "open", ""))
        self.assertIsNotNone(wire.reconnect_gap(FakeNode(early), {"after": "refuse", "gap_ms": {"ge": 2000}}))

    def test_a_late_grant_must_be_released_with_its_own_token(self) -> None:
        log = _log((1.0, 1, "out", "A 77 k"), (1.1, 1, "in", "R k 76"), (1.2, 2, "in", "R k 77"))
        self.assertIsNone(wire.late_grant_released(FakeNode(log), {"key": "k", "gap_ms": {"le": 500}}))
        self.assertIsNotNone(wire.late_grant_released(FakeNode(log), {"key": "k", "gap_ms": {"le": 100}}))


STEP_KINDS = {"connect", "cmd", "await", "pending", "poll", "event", "no_event", "node", "wait_role",
              "wait_info", "script", "wire", "sleep_ms", "repeat", "raw"}


class Scenarios(unittest.TestCase):
    """Every scenario file loads, says what it covers, and names only steps and checks that exist."""

    def _steps(self, steps: list[dict[str, object]]) -> list[dict[str, object]]:
        out = []
        for step in steps:
            out.append(step)
            if "repeat" in step:
                out += self._steps(step["steps"])  # type: ignore[arg-type]
            if "poll" in step:
                out += self._steps([step["poll"]])  # type: ignore[list-item]
        return out

    def test_every_scenario_is_well_formed(self) -> None:
        here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scenarios")
        names = sorted(f for f in os.listdir(here) if f.endswith(".json"))
        self.assertGreater(len(names), 40)
        for name in names:
            sc = scenario.load(os.path.join(here, name))
            self.assertTrue(sc.covers, name)
            for cover in sc.covers:
                self.assertRegex(cover, r"^[0-9]+(, [0-9]+)*: ", f"{name}: a cover names its section")
            for step in self._steps(sc.steps):
                kinds = STEP_KINDS & step.keys()
                self.assertEqual(len(kinds), 1, f"{name}: one kind of step: {step}")
                if "wire" in step:
                    self.assertIn(step["check"], wire.CHECKS, name)
                if "sleep_ms" in step:
                    self.assertTrue(step.get("why"), f"{name}: a sleep says why")


class Scripted(unittest.TestCase):
    def setUp(self) -> None:
        self.node = ScriptedNode("t", free_ports(1)[0])
        self.addCleanup(self.node.close)

    def _conn(self) -> tuple[socket.socket, "socket.SocketIO"]:
        s = socket.create_connection(("127.0.0.1", self.node.port), timeout=5)
        self.addCleanup(s.close)
        return s, s.makefile("rb")

    def test_grants_above_2_63_in_fifo_order(self) -> None:
        s, f = self._conn()
        s.sendall(b"A k 30 0\nA k 30 0\n")
        self.assertEqual(f.readline(), f"A {TOKEN_BASE} k\n".encode())
        s.sendall(f"R k {TOKEN_BASE}\n".encode())
        self.assertEqual(f.readline(), b"R k\n")
        self.assertEqual(f.readline(), f"A {TOKEN_BASE + 1} k\n".encode())

    def test_rules_count_every_match_and_fire_on_their_nth(self) -> None:
        self.node.add_rules([{"on": {"op": "Q", "nth": 1}, "do": {"reply": "Q k 0 0 7"}},
                             {"on": {"op": "Q", "nth": 2}, "do": {"reply": "Q k 0 0 8"}}])
        s, f = self._conn()
        s.sendall(b"Q k\nQ k\nQ k\n")
        self.assertEqual([f.readline() for _ in range(3)], [b"Q k 0 0 7\n", b"Q k 0 0 8\n", b"Q k 0 0 0\n"])

    def test_held_answers_go_out_in_reverse(self) -> None:
        self.node.add_rules([{"on": {"op": "A"}, "do": {"hold_answers": 2}}])
        s, f = self._conn()
        s.sendall(b"A a 30 0\nA b 30 0\n")
        first, second = f.readline(), f.readline()
        self.assertTrue(first.endswith(b" b\n") and second.endswith(b" a\n"), (first, second))

    def test_refusal_closes_and_listens_again(self) -> None:
        s, f = self._conn()
        s.sendall(b"I\n")
        self.assertTrue(f.readline().startswith(b"I role=active"))
        self.node.refuse(200)
        self.assertEqual(f.readline(), b"")
        with self.assertRaises(OSError):
            socket.create_connection(("127.0.0.1", self.node.port), timeout=1).close()
        deadline = time.monotonic() + 5
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.node.port), timeout=1).close()
                break
            except OSError:
                self.assertLess(time.monotonic(), deadline, "never listened again")
                time.sleep(0.02)


if __name__ == "__main__":
    unittest.main()
