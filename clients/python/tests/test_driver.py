"""The conformance driver (``python -m baton_locks._driver [--asyncio]``)
speaks the driver protocol against a real batond: ready line, answers by
id, events, error kinds, and exit within 2 s."""

import json
import os
import queue
import subprocess
import sys
import threading
import time

import pytest

from conftest import DEADLINE, INSTALLED, SOURCE


class Driver:
    def __init__(self, flags):
        env = dict(os.environ)
        if not INSTALLED:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SOURCE), env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "baton_locks._driver"] + flags,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.events = []
        self.answers = {}
        self.next_id = 0
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)

    def line(self):
        try:
            return json.loads(self.lines.get(timeout=DEADLINE))
        except queue.Empty:
            pytest.fail("the driver said nothing")

    def send(self, cmd, **fields):
        self.next_id += 1
        self.proc.stdin.write(json.dumps(dict(id=self.next_id, cmd=cmd, **fields)) + "\n")
        self.proc.stdin.flush()
        return self.next_id

    def answer(self, rid):
        while rid not in self.answers:
            msg = self.line()
            if "event" in msg:
                self.events.append(msg)
            else:
                self.answers[msg["id"]] = msg
        return self.answers.pop(rid)

    def call(self, cmd, **fields):
        return self.answer(self.send(cmd, **fields))

    def event(self, pred):
        while True:
            for e in self.events:
                if pred(e):
                    self.events.remove(e)
                    return e
            msg = self.line()
            if "event" in msg:
                self.events.append(msg)
            else:
                self.answers[msg["id"]] = msg

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(DEADLINE)
        sys.stderr.write(self.proc.stderr.read())


@pytest.mark.parametrize("flags,name", [([], "python"), (["--asyncio"], "python-asyncio")])
def test_the_driver_speaks_the_protocol(node, flags, name):
    d = Driver(flags)
    try:
        ready = {"ready": True, "client": name, "version": __import__("baton_locks").__version__}
        if name == "python":
            ready["cancel"] = False  # a blocking call cannot be given up
        assert d.line() == ready
        c = d.call("connect", addrs=[node.addr])["ok"]["client"]
        w = d.call("watch", client=c, key="dk")["ok"]["watch"]
        assert d.event(lambda e: e.get("watch") == w)["token"] == "0"
        g = d.call("acquire", client=c, key="dk", lease_ms=5000)["ok"]
        assert int(g["token"]) > 2**53 and g["slot"] == 0
        assert d.event(lambda e: e.get("watch") == w and e["token"] == g["token"])["holders"] == 1
        tried = d.call("acquire", client=c, key="dk", lease_ms=5000, wait_ms=0)
        assert tried.get("error", {}).get("kind") == "timeout", tried
        q = d.call("query", client=c, key="dk")["ok"]
        assert q["token"] == g["token"] and 0 < q["ms_left"] <= 5000 and q["waiting"] == 0
        assert d.call("release", grant=g["grant"]) == {"id": d.next_id, "ok": {}}
        assert d.call("release", grant=g["grant"])["error"]["kind"] == "closed"
        assert d.call("unwatch", watch=w)["ok"] == {}
        assert d.call("acquire", client=c, key="dk", lease_ms=1000, limit=2)["ok"]["slot"] == 0
        err = d.call("acquire", client=c, key="dk", lease_ms=1000)["error"]
        assert err == {"kind": "refused", "detail": "limit-mismatch"}
        h = d.call("hold", client=c, key="hk", lease_ms=300, value="me", limit=1)["ok"]
        assert d.call("leader", client=c, key="hk")["ok"] == {
            "token": h["token"], "holders": 1, "waiting": 0, "value": "me"
        }
        assert d.call("keep", grant=h["grant"], lease_ms=300)["ok"] == {}
        assert d.call("acquire", client=c, key="x", lease_ms=0)["error"]["kind"] == "bad-argument"
        assert d.call("nonsense")["error"]["kind"] == "bad-argument"
        assert d.call("release", grant="nope")["error"]["kind"] == "bad-argument"
        assert d.call("close", client=c)["ok"] == {}
        assert d.call("query", client=c, key="hk")["error"]["kind"] == "closed"
        assert d.call("release", grant=h["grant"])["error"]["kind"] == "closed"
        assert not [e for e in d.events if e.get("event") == "lost"], "no lost event at close"
        start = time.monotonic()
        assert d.call("exit")["ok"] == {}
        assert d.proc.wait(DEADLINE) == 0
        assert time.monotonic() - start < 2.5
    finally:
        d.kill()


@pytest.mark.parametrize("flags", [[], ["--asyncio"]])
def test_the_driver_exits_at_the_end_of_stdin_with_a_call_waiting(node, flags):
    d = Driver(flags)
    try:
        d.line()
        c = d.call("connect", addrs=[node.addr])["ok"]["client"]
        d.call("acquire", client=c, key="w", lease_ms=5000)
        d.send("acquire", client=c, key="w", lease_ms=5000)  # waits in line
        d.proc.stdin.close()
        start = time.monotonic()
        assert d.proc.wait(DEADLINE) == 0
        assert time.monotonic() - start < 2.5
    finally:
        d.kill()
