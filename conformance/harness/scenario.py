"""Loading a scenario file and playing it against one driver.

Owns the scenario format (docs/conformance.md has the whole of it) and one
run: its real nodes and scripted nodes, the driver process, the results
saved by name, the events consumed, and the verdict: ``pass``, ``n/a`` (the
client lacks a capability the scenario needs, such as giving up a call) or
a failure with the step that failed and why.

Every answer and event is also checked against the driver protocol's shape
(tokens as decimal strings, slots and counts as integers, error kinds from
the fixed list), whatever the scenario expects, so a driver cannot pass by
reporting a token as a float.

Never does: leave a process behind. Nodes, scripted nodes and the driver
are stopped in ``finally``, by PID.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

from . import wire
from .driver import Driver, DriverError
from .matching import mismatch, resolve
from .nodes import NodeError, Nodes
from .ports import free_ports
from .scripted import ScriptedNode

KINDS = {"timeout", "refused", "unavailable", "lost", "closed", "bad-argument"}
DEFAULT_ANSWER_MS = 15_000
SCENARIO_LIMIT_S = 120.0
ID_FIELDS = {"client": "client", "grant": "grant", "watch": "watch"}
DECIMAL = re.compile(r"^(0|[1-9][0-9]{0,19})$")


class StepFailed(Exception):
    pass


class NotApplicable(Exception):
    pass


@dataclass
class Scenario:
    name: str
    path: str
    covers: list[str]
    needs: list[str]
    setup: dict[str, Any]
    steps: list[dict[str, Any]]


def load(path: str) -> Scenario:
    with open(path) as f:
        data = json.load(f)
    name = os.path.splitext(os.path.basename(path))[0]
    for k in ("covers", "steps"):
        if k not in data:
            raise ValueError(f"{path}: no {k!r}")
    return Scenario(name, path, list(data["covers"]), list(data.get("needs", [])),
                    dict(data.get("setup", {})), list(data["steps"]))


def _u64(value: Any) -> bool:
    return isinstance(value, str) and bool(DECIMAL.match(value)) and int(value) < 2**64


def shape_error(cmd: str, body: dict[str, Any]) -> str | None:
    """Why an answer to ``cmd`` does not have the driver protocol's shape, or None."""
    if "error" in body:
        err = body["error"]
        if err.get("kind") not in KINDS:
            return f"unknown error kind {err.get('kind')!r}"
        if not isinstance(err.get("detail"), str):
            return "an error's detail is not a string"
        return None
    ok = body["ok"]
    if not isinstance(ok, dict):
        return "ok is not an object"
    want: dict[str, Any] = {
        "connect": {"client": str},
        "acquire": {"grant": str, "token": "u64", "slot": int},
        "hold": {"grant": str, "token": "u64", "slot": int},
        "campaign": {"grant": str, "token": "u64", "slot": int},
        "query": {"token": "u64", "ms_left": int, "waiting": int},
        "leader": {"token": "u64", "holders": int, "waiting": int, "value": "str?"},
        "watch": {"watch": str},
    }.get(cmd, {})
    for field, kind in want.items():
        v = ok.get(field, _ABSENT)
        if v is _ABSENT:
            return f"ok has no {field!r}"
        if kind == "u64" and not _u64(v):
            return f"{field} {v!r} is not a u64 as a decimal string"
        if kind is int and (not isinstance(v, int) or isinstance(v, bool)):
            return f"{field} {v!r} is not an integer"
        if kind is str and not isinstance(v, str):
            return f"{field} {v!r} is not a string"
        if kind == "str?" and v is not None and not isinstance(v, str):
            return f"{field} {v!r} is neither a string nor null"
    if cmd in ("acquire", "hold", "campaign") and ok.get("token") == "0":
        return "a grant's token is 0"
    return None


def event_shape_error(body: dict[str, Any]) -> str | None:
    kind = body.get("event")
    if kind == "lost":
        return None if isinstance(body.get("grant"), str) else "a lost event without a grant"
    if kind == "state":
        for field, ok in (("watch", isinstance(body.get("watch"), str)),
                          ("token", _u64(body.get("token"))),
                          ("holders", isinstance(body.get("holders"), int)),
                          ("waiting", isinstance(body.get("waiting"), int)),
                          ("value", body.get("value") is None or isinstance(body.get("value"), str))):
            if not ok:
                return f"a state event's {field} is wrong: {body}"
        return None
    return f"unknown event {kind!r}"


_ABSENT = object()


class Run:
    """One scenario against one driver."""

    def __init__(self, scenario: Scenario, client: str, argv: list[str], root: str, batond: str,
                 workdir: str, secrets: dict[str, str]) -> None:
        self.sc = scenario
        self.client = client
        self.argv = argv
        self.root = root
        self.workdir = workdir
        self.secrets = secrets
        self.nodes = Nodes(batond, workdir)
        self.scripted: dict[str, ScriptedNode] = {}
        self.driver: Driver | None = None
        self.saved: dict[str, Any] = {}
        self.pending: dict[str, tuple[int, float, str]] = {}
        self.consumed: set[int] = set()
        self.timers: list[threading.Timer] = []
        self.step_no = 0
        self.deadline = 0.0

    # -- the verdict ---------------------------------------------------------

    def play(self) -> tuple[str, str]:
        """(``pass`` | ``n/a`` | ``FAIL``, detail)."""
        self.deadline = time.monotonic() + SCENARIO_LIMIT_S
        try:
            self._setup()
            for step in self.sc.steps:
                self._step(step)
            assert self.driver is not None
            errors = self.driver.protocol_errors()
            if errors:
                raise StepFailed("driver protocol: " + errors[0])
            code = self.driver.stop()
            if code != 0:
                raise StepFailed(f"the driver did not exit 0 at the end of its input (exit {code})")
            return "pass", ""
        except NotApplicable as e:
            return "n/a", str(e)
        except (StepFailed, DriverError, NodeError) as e:
            return "FAIL", f"step {self.step_no}: {e}"
        except Exception as e:  # a bug in the scenario or the runner: say so, never hide it
            return "FAIL", f"step {self.step_no}: runner error {type(e).__name__}: {e}"
        finally:
            self._teardown()

    def report(self) -> str:
        parts = []
        if self.driver is not None:
            parts.append(f"--- driver stderr (tail) ---\n{self.driver.stderr_tail()}")
        for node in self.scripted.values():
            tail = node.log[-40:] if node.log else []
            lines = [f"{e['t']:.3f} c{e['conn']} {e['kind']} {e['line']}" for e in tail]
            parts.append(f"--- scripted {node.name} wire (tail) ---\n" + "\n".join(lines))
        parts.append(self.nodes.logs())
        return "\n".join(p for p in parts if p)

    def _teardown(self) -> None:
        for t in self.timers:
            t.cancel()
        if self.driver is not None and self.driver.proc.poll() is None:
            self.driver.stop()
        self.nodes.stop_all()
        for node in self.scripted.values():
            node.close()

    # -- setup ---------------------------------------------------------------

    def _setup(self) -> None:
        setup = self.sc.setup
        if "nodes" in setup:
            self.nodes.make(setup["nodes"], self.secrets)
            names = setup["nodes"].get("start", list(self.nodes.nodes))
            for name in names:
                self.nodes[name].start()
            if len(self.nodes.nodes) > 1 and "n0" in names:
                self.nodes.wait_role("n0", "active", 20, standbys=len(names) - 1)
        for i in range(int(setup.get("scripted", {}).get("count", 0))):
            auth = self.secrets["auth"] if setup["scripted"].get("auth") else None
            name = f"s{i}"
            self.scripted[name] = ScriptedNode(name, free_ports(1)[0], auth)
        self.driver = Driver(self.client, self.argv, self.root,
                             os.path.join(self.workdir, "driver.stderr"))
        ready = self.driver.ready or {}
        for need in self.sc.needs:
            if ready.get(need) is False:
                raise NotApplicable(f"the driver says it has no {need!r}")

    # -- lookups -------------------------------------------------------------

    def lookup(self, path: str) -> Any:
        name, _, field = path.partition(".")
        if name in self.nodes.nodes:
            obj: Any = {"addr": self.nodes[name].addr, "port": self.nodes[name].port}
        elif name in self.scripted:
            obj = {"addr": self.scripted[name].addr, "port": self.scripted[name].port}
        elif name in self.saved:
            obj = self.saved[name]
        else:
            raise StepFailed(f"nothing saved as {name!r}")
        for part in field.split(".") if field else []:
            if not isinstance(obj, dict) or part not in obj:
                raise StepFailed(f"{name!r} has no {field!r}: {obj!r}")
            obj = obj[part]
        return obj

    def _addr(self, name: str) -> str:
        if ":" in name:
            return name
        return str(self.lookup(f"{name}.addr"))

    def _secret(self, value: Any) -> Any:
        if isinstance(value, str) and value.startswith("@"):
            return self.secrets[value[1:]]
        if isinstance(value, dict):
            return {k: self._secret(v) for k, v in value.items()}
        return value

    def _request(self, step: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if "connect" in step:
            req: dict[str, Any] = {"cmd": "connect", "addrs": [self._addr(a) for a in step["to"]]}
            for k in ("auth", "tls"):
                if k in step:
                    req[k] = self._secret(step[k])
            return "connect", req
        cmd = step["cmd"]
        req = {"cmd": cmd}
        for k, v in step.items():
            if k in ("cmd", "as", "async", "expect", "within_ms", "elapsed_ms", "save_time"):
                continue
            if k in ID_FIELDS and isinstance(v, str) and v in self.saved:
                saved = self.saved[v]
                req[k] = saved[ID_FIELDS[k]] if isinstance(saved, dict) and ID_FIELDS[k] in saved else v
            elif k == "addrs":
                req[k] = [self._addr(a) for a in v]
            elif k in ("auth", "tls"):
                req[k] = self._secret(v)
            else:
                req[k] = resolve(v, self.lookup)
        return cmd, req

    # -- steps ---------------------------------------------------------------

    def _step(self, step: dict[str, Any], i: int | None = None) -> None:
        if time.monotonic() > self.deadline:
            raise StepFailed(f"the scenario ran past its {SCENARIO_LIMIT_S:.0f} s limit")
        if i is None:
            self.step_no += 1
        assert self.driver is not None
        if "repeat" in step:
            for n in range(int(step["repeat"])):
                for sub in step["steps"]:
                    self._step(json.loads(json.dumps(sub).replace("{i}", str(n))), n)
            return
        if "poll" in step:
            self._poll(step)
        elif "connect" in step or "cmd" in step:
            self._cmd(step)
        elif "await" in step:
            self._await(step)
        elif "pending" in step:
            rid, _, _ = self.pending[step["pending"]]
            end = time.monotonic() + step["for_ms"] / 1000
            while time.monotonic() < end:
                if self.driver.answered(rid):
                    _, body = self.driver.wait_answer(rid, 0)
                    raise StepFailed(f"{step['pending']} was answered early: {body}")
                time.sleep(0.01)
        elif "event" in step:
            self._event(step)
        elif "no_event" in step:
            self._no_event(step)
        elif "node" in step:
            node = self.nodes[step["node"]]
            {"kill": node.kill, "term": node.term, "start": node.start,
             "stop": lambda: node.signal(19), "cont": lambda: node.signal(18)}[step["do"]]()
        elif "wait_role" in step:
            self.nodes.wait_role(step["wait_role"], step["role"], step.get("within_ms", 15000) / 1000,
                                 step.get("standbys"))
        elif "wait_info" in step:
            self._wait_info(step)
        elif "script" in step:
            self._script(step)
        elif "wire" in step:
            params = resolve({k: v for k, v in step.items() if k not in ("wire", "check")}, self.lookup)
            check = wire.CHECKS[step["check"]]
            node = self.scripted[step["wire"]]
            end = time.monotonic() + params.get("within_ms", 0) / 1000
            while (why := check(node, params)) and time.monotonic() < end:
                time.sleep(0.02)
            if why:
                raise StepFailed(f"wire check {step['check']}: {why}")
        elif "sleep_ms" in step:
            if not step.get("why"):
                raise StepFailed("a sleep needs a why")
            time.sleep(step["sleep_ms"] / 1000)
        elif "raw" in step:
            if "id" in step:
                self.driver.expect_id(step["id"])
                self.pending[step.get("as", f"raw{step['id']}")] = (step["id"], time.monotonic(), "raw")
            self.driver.send_raw(step["raw"] + "\n")
        else:
            raise StepFailed(f"unknown step {step}")

    def _cmd(self, step: dict[str, Any]) -> None:
        assert self.driver is not None
        cmd, req = self._request(step)
        sent = time.monotonic()
        rid = self.driver.send(req)
        name = step.get("as") or (step.get("connect") if "connect" in step else None)
        if step.get("async"):
            if not name:
                raise StepFailed("an async step needs a name (as)")
            self.pending[name] = (rid, sent, cmd)
            return
        self._finish(rid, sent, cmd, name, step)

    def _poll(self, step: dict[str, Any]) -> None:
        """Send the step's request again every 20 ms until its answer matches, in time."""
        end = time.monotonic() + step.get("within_ms", 5000) / 1000
        while True:
            try:
                self._cmd(step["poll"])
                return
            except StepFailed as e:
                if time.monotonic() >= end:
                    raise StepFailed(f"never so within {step.get('within_ms', 5000)} ms: {e}") from e
            time.sleep(0.02)

    def _await(self, step: dict[str, Any]) -> None:
        rid, sent, cmd = self.pending.pop(step["await"])
        self._finish(rid, sent, cmd, step["await"], step)

    def _finish(self, rid: int, sent: float, cmd: str, name: str | None, step: dict[str, Any]) -> None:
        assert self.driver is not None
        at, body = self.driver.wait_answer(rid, step.get("within_ms", DEFAULT_ANSWER_MS) / 1000)
        if cmd != "raw":
            why = shape_error(cmd, body)
            if why:
                raise StepFailed(f"{cmd} answer {body}: {why}")
        elapsed = round((at - sent) * 1000)
        expect = step.get("expect", "ok")
        if expect == "ok":
            if "ok" not in body:
                raise StepFailed(f"{cmd}: expected ok, got {body}")
        elif expect != "any":
            expect = resolve(expect, self.lookup)
            if isinstance(expect, dict) and isinstance(expect.get("error"), str):
                expect = {"error": {"kind": expect["error"]}}
            why = mismatch(expect, body)
            if why:
                raise StepFailed(f"{cmd}: {why} (answer {body})")
        if "elapsed_ms" in step:
            why = mismatch(resolve(step["elapsed_ms"], self.lookup), elapsed, f"{cmd} took (ms)")
            if why:
                raise StepFailed(why)
        if name:
            value = dict(body.get("ok", {})) if "ok" in body else {"error": body["error"]}
            value["elapsed_ms"] = elapsed
            self.saved[name] = value

    def _stream_of(self, pattern: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for k, v in pattern.items():
            if k in ("grant", "watch") and isinstance(v, str) and v in self.saved:
                out[k] = self.saved[v][k]
            else:
                out[k] = resolve(v, self.lookup)
        return out

    def _event(self, step: dict[str, Any]) -> None:
        assert self.driver is not None
        pattern = self._stream_of(step["event"])
        stream = {k: pattern[k] for k in ("event", "grant", "watch") if k in pattern}
        skip = step.get("skip", False)

        def pick(i: int, body: dict[str, Any]) -> bool:
            # The next unconsumed event of the stream; with skip, the next
            # one that matches (those before it are consumed).
            if i in self.consumed or not all(body.get(k) == v for k, v in stream.items()):
                return False
            why = event_shape_error(body)
            if why:
                raise StepFailed(why)
            if skip and mismatch(pattern, body) is not None:
                self.consumed.add(i)
                return False
            return True

        got = self.driver.wait_event(pick, 0, step.get("within_ms", 5000) / 1000)
        if got is None:
            raise StepFailed(f"no event {pattern} within {step.get('within_ms', 5000)} ms")
        i, event = got
        self.consumed.add(i)
        why = mismatch(pattern, event.body)
        if why:
            raise StepFailed(f"the next event {event.body} does not match {pattern}: {why}")
        if "as" in step:
            self.saved[step["as"]] = dict(event.body)

    def _no_event(self, step: dict[str, Any]) -> None:
        assert self.driver is not None
        pattern = self._stream_of(step["no_event"])

        def pick(i: int, body: dict[str, Any]) -> bool:
            return i not in self.consumed and mismatch(pattern, body) is None

        got = self.driver.wait_event(pick, 0, step["for_ms"] / 1000)
        if got is not None:
            raise StepFailed(f"an event that must not come came: {got[1].body}")

    def _wait_info(self, step: dict[str, Any]) -> None:
        """Poll a real node's ``I`` until its fields match, in time."""
        node = self.nodes[step["wait_info"]]
        fields = resolve(step["fields"], self.lookup)
        end = time.monotonic() + step.get("within_ms", 5000) / 1000
        while True:
            info = node.info()
            why = mismatch(fields, info) if info is not None else "no answer"
            if why is None:
                return
            if time.monotonic() >= end:
                raise StepFailed(f"{step['wait_info']}'s I never matched: {why} ({info})")
            time.sleep(0.02)

    def _script(self, step: dict[str, Any]) -> None:
        node = self.scripted[step["script"]]
        if "rules" in step:
            node.add_rules(resolve(step["rules"], self.lookup))
        if "refuse_ms" in step:
            node.refuse(int(step["refuse_ms"]))
        if "redirect" in step:
            target = step["redirect"]
            node.redirect(None if target is None else ("-" if target == "-" else self._addr(target)))
            if "for_ms" in step:
                timer = threading.Timer(step["for_ms"] / 1000, node.redirect, (None,))
                timer.daemon = True
                timer.start()
                self.timers.append(timer)
