"""The conformance driver of the Python client: JSON lines on stdin and
stdout, as the conformance suite speaks them (see ``conformance/`` and
``docs`` of the repository).

    python3 -m baton_locks._driver            # the blocking Client ("python")
    python3 -m baton_locks._driver --asyncio  # AsyncClient ("python-asyncio")

A thin adapter over the public API: each request runs on a thread of its
own (blocking flavour) or a task of its own (asyncio flavour), and is
answered once with its ``id``. Logs go to stderr only.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
import sys
import threading
import time
from typing import Any, Callable, Dict, Optional, Tuple, Union

import baton_locks
from baton_locks import (
    AsyncCampaign,
    AsyncClient,
    AsyncHeld,
    AsyncWatch,
    Campaign,
    Client,
    Grant,
    Held,
    Watch,
    WatchState,
)

Json = Dict[str, Any]

_out_lock = threading.Lock()


def emit(obj: Json) -> None:
    line = json.dumps(obj, separators=(",", ":")) + "\n"
    with _out_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


class BadRequest(Exception):
    """A request whose fields do not fit, or an unknown id."""


def error_of(e: BaseException) -> Json:
    """The error kind of an exception, as the driver protocol names it."""
    if isinstance(e, (baton_locks.Timeout, Cancelled)):
        return {"kind": "timeout", "detail": str(e)}
    if isinstance(e, baton_locks.Refused):
        return {"kind": "refused", "detail": e.reason}
    if isinstance(e, baton_locks.Lost):
        return {"kind": "lost", "detail": str(e)}
    if isinstance(e, baton_locks.Closed):
        return {"kind": "closed", "detail": str(e)}
    if isinstance(e, baton_locks.Unavailable):
        return {"kind": "unavailable", "detail": str(e)}
    if isinstance(e, (BadRequest, TypeError, ValueError, KeyError)):
        return {"kind": "bad-argument", "detail": str(e)}
    return {"kind": "unavailable", "detail": "%s: %s" % (type(e).__name__, e)}


def field(req: Json, name: str, kind: Union[type, Tuple[type, ...]], required: bool = True) -> Any:
    if name not in req or req[name] is None:
        if required:
            raise BadRequest("missing field %r" % name)
        return None
    value = req[name]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise BadRequest("field %r has the wrong type" % name)
    return value


def tls_context(tls: Any) -> Optional[ssl.SSLContext]:
    if tls is None:
        return None
    if not isinstance(tls, dict):
        raise BadRequest("tls is an object")
    context = ssl.create_default_context(cafile=tls.get("ca"))
    if tls.get("cert"):
        context.load_cert_chain(tls["cert"], tls.get("key"))
    return context


def acquire_args(req: Json) -> Tuple[str, float, Optional[float], Optional[int], Optional[str]]:
    key = field(req, "key", str)
    lease = field(req, "lease_ms", int) / 1000.0
    wait_ms = field(req, "wait_ms", int, required=False)
    wait = None if wait_ms is None else wait_ms / 1000.0
    return key, lease, wait, field(req, "limit", int, False), field(req, "value", str, False)


def granted(gid: str, grant: Union[Grant, Held, AsyncHeld]) -> Json:
    return {"grant": gid, "token": str(grant.token), "slot": grant.slot}


def text(value: Union[str, bytes, None]) -> Optional[str]:
    if value is None or isinstance(value, str):
        return value
    return value.decode("utf-8", "replace")


def state_of(state: WatchState) -> Json:
    return {
        "token": str(state.token),
        "holders": state.holders,
        "waiting": state.waiting,
        "value": text(state.value),
    }


class Driver:
    """What both flavours keep: the ids of clients, grants and watches."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counter = 0
        self.clients: Dict[str, Any] = {}
        self.grants: Dict[str, Tuple[str, Any, str]] = {}
        self.watches: Dict[str, Any] = {}

    def new_id(self, prefix: str) -> str:
        with self.lock:
            self.counter += 1
            return "%s%d" % (prefix, self.counter)

    def client(self, req: Json) -> Any:
        cid = field(req, "client", str)
        try:
            return self.clients[cid]
        except KeyError:
            raise BadRequest("unknown client %r" % cid) from None

    def grant(self, req: Json) -> Tuple[str, Any, str]:
        gid = field(req, "grant", str)
        try:
            return self.grants[gid]
        except KeyError:
            raise BadRequest("unknown grant %r" % gid) from None

    def connect_args(self, req: Json) -> Json:
        addrs = field(req, "addrs", list)
        if not addrs or not all(isinstance(a, str) for a in addrs):
            raise BadRequest("addrs is a list of host:port")
        return {"servers": addrs, "auth": field(req, "auth", str, False), "tls": tls_context(req.get("tls"))}


# --- the blocking flavour -------------------------------------------------


class SyncDriver(Driver):
    def handle(self, req: Json) -> Json:
        cmd = req.get("cmd")
        if cmd == "connect":
            client = Client(**self.connect_args(req))
            cid = self.new_id("c")
            self.clients[cid] = client
            return {"client": cid}
        if cmd in ("acquire", "hold"):
            client = self.client(req)
            key, lease, wait, limit, value = acquire_args(req)
            call = client.acquire if cmd == "acquire" else client.hold
            grant = call(key, lease, wait, limit=limit, value=value)
            gid = self.new_id("g")
            self.grants[gid] = (cmd, grant, req["client"])
            if cmd == "hold":
                self.watch_lost(gid, grant)
            return granted(gid, grant)
        if cmd == "campaign":
            client = self.client(req)
            wait_ms = field(req, "wait_ms", int, False)
            campaign = client.campaign(
                field(req, "key", str),
                field(req, "value", str),
                field(req, "lease_ms", int) / 1000.0,
                None if wait_ms is None else wait_ms / 1000.0,
            )
            gid = self.new_id("g")
            self.grants[gid] = ("campaign", campaign, req["client"])
            self.watch_lost(gid, campaign)
            return granted(gid, campaign)
        if cmd == "release":
            kind, grant, cid = self.grant(req)
            if kind == "acquire":
                if grant.released:
                    raise baton_locks.Closed("the grant was released")
                ok = self.clients[cid].release(grant)
            else:
                ok = grant.release()
            if not ok:
                raise baton_locks.Lost("the grant was not held (N)")
            return {}
        if cmd == "keep":
            kind, grant, cid = self.grant(req)
            lease = field(req, "lease_ms", int) / 1000.0
            if kind == "acquire":
                self.clients[cid].keep(grant, lease)
            else:
                grant.keep(lease)
            return {}
        if cmd == "query":
            status = self.client(req).query(field(req, "key", str))
            return {
                "token": str(status.token or 0),
                "ms_left": int(round(status.time_left * 1000)),
                "waiting": status.waiting,
            }
        if cmd == "leader":
            return state_of(self.client(req).leader(field(req, "key", str)))
        if cmd == "watch":
            watch = self.client(req).watch(field(req, "key", str))
            wid = self.new_id("w")
            gate = threading.Lock()
            self.watches[wid] = (watch, gate)
            emit({"id": req["id"], "ok": {"watch": wid}})
            threading.Thread(target=self.pump, args=(wid, watch, gate), daemon=True).start()
            raise Answered()
        if cmd == "unwatch":
            wid = field(req, "watch", str)
            if wid not in self.watches:
                raise BadRequest("unknown watch %r" % wid)
            watch, gate = self.watches[wid]
            with gate:
                watch.close()
            return {}
        if cmd == "close":
            client = self.client(req)
            client.close()
            return {}
        raise BadRequest("unknown cmd %r" % cmd)

    def pump(self, wid: str, watch: Watch, gate: threading.Lock) -> None:
        try:
            for state in watch:
                with gate:
                    if watch.closed:
                        return
                    emit(dict(event="state", watch=wid, **state_of(state)))
        except baton_locks.Error as e:
            logging.info("watch %s ended: %s", wid, e)

    def watch_lost(self, gid: str, held: Union[Held, Campaign]) -> None:
        def wait() -> None:
            while held.is_held():
                held.lost.wait(0.5)
            if held.lost.is_set():
                emit({"event": "lost", "grant": gid})

        threading.Thread(target=wait, daemon=True).start()

    running: "set[threading.Thread]" = set()

    def run_one(self, req: Json) -> None:
        rid = req.get("id")
        try:
            ok = self.handle(req)
            emit({"id": rid, "ok": ok})
        except Answered:
            pass
        except Exception as e:  # every error is answered, never fatal
            emit({"id": rid, "error": error_of(e)})
        finally:
            self.running.discard(threading.current_thread())

    def close_all(self) -> None:
        """At the end: close every client (bounded), then give the
        requests still running (failing ``closed`` now) a moment to
        answer."""
        threads = [threading.Thread(target=c.close, daemon=True) for c in self.clients.values()]
        for t in threads:
            t.start()
        end = time.monotonic() + 1.2
        for t in threads:
            t.join(max(0.0, end - time.monotonic()))
        end = time.monotonic() + 0.3
        for t in list(self.running):
            t.join(max(0.0, end - time.monotonic()))


class Cancelled(Exception):
    """The driver gave a call up (``cancel_after_ms``)."""


class Answered(Exception):
    """The handler wrote its answer itself (``watch``)."""


# --- the asyncio flavour --------------------------------------------------


class AsyncDriver(Driver):
    def __init__(self) -> None:
        super().__init__()
        self.tasks: "set[asyncio.Task[None]]" = set()

    async def handle(self, req: Json) -> Optional[Json]:
        cmd = req.get("cmd")
        if cmd == "connect":
            client = AsyncClient(**self.connect_args(req))
            cid = self.new_id("c")
            self.clients[cid] = client
            return {"client": cid}
        if cmd in ("acquire", "hold"):
            client = self.client(req)
            key, lease, wait, limit, value = acquire_args(req)
            call = client.acquire if cmd == "acquire" else client.hold
            grant = await self.cancellable(req, call(key, lease, wait, limit=limit, value=value))
            gid = self.new_id("g")
            self.grants[gid] = (cmd, grant, req["client"])
            if cmd == "hold":
                self.spawn(self.watch_lost(gid, grant))
            return granted(gid, grant)
        if cmd == "campaign":
            client = self.client(req)
            wait_ms = field(req, "wait_ms", int, False)
            campaign = await self.cancellable(
                req,
                client.campaign(
                    field(req, "key", str),
                    field(req, "value", str),
                    field(req, "lease_ms", int) / 1000.0,
                    None if wait_ms is None else wait_ms / 1000.0,
                ),
            )
            gid = self.new_id("g")
            self.grants[gid] = ("campaign", campaign, req["client"])
            self.spawn(self.watch_lost(gid, campaign))
            return granted(gid, campaign)
        if cmd == "release":
            kind, grant, cid = self.grant(req)
            if kind == "acquire":
                if grant.released:
                    raise baton_locks.Closed("the grant was released")
                ok = await self.clients[cid].release(grant)
            else:
                ok = await grant.release()
            if not ok:
                raise baton_locks.Lost("the grant was not held (N)")
            return {}
        if cmd == "keep":
            kind, grant, cid = self.grant(req)
            lease = field(req, "lease_ms", int) / 1000.0
            if kind == "acquire":
                await self.clients[cid].keep(grant, lease)
            else:
                await grant.keep(lease)
            return {}
        if cmd == "query":
            status = await self.client(req).query(field(req, "key", str))
            return {
                "token": str(status.token or 0),
                "ms_left": int(round(status.time_left * 1000)),
                "waiting": status.waiting,
            }
        if cmd == "leader":
            return state_of(await self.client(req).leader(field(req, "key", str)))
        if cmd == "watch":
            watch = self.client(req).watch(field(req, "key", str))
            wid = self.new_id("w")
            self.watches[wid] = watch
            emit({"id": req["id"], "ok": {"watch": wid}})
            self.spawn(self.pump(wid, watch))
            return None
        if cmd == "unwatch":
            wid = field(req, "watch", str)
            if wid not in self.watches:
                raise BadRequest("unknown watch %r" % wid)
            self.watches[wid].close()
            return {}
        if cmd == "close":
            await self.client(req).close()
            return {}
        raise BadRequest("unknown cmd %r" % cmd)

    @staticmethod
    async def cancellable(req: Json, call: Any) -> Any:
        """``cancel_after_ms``: the caller gives the call up (cancels its
        task) that long after sending it."""
        after = field(req, "cancel_after_ms", int, required=False)
        if after is None:
            return await call
        task = asyncio.ensure_future(call)
        done, _ = await asyncio.wait([task], timeout=after / 1000.0)
        if not done:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            else:
                return task.result()
            raise Cancelled("cancelled by the caller after %d ms" % after)
        return task.result()

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def pump(self, wid: str, watch: AsyncWatch) -> None:
        try:
            async for state in watch:
                if watch.closed:
                    return
                emit(dict(event="state", watch=wid, **state_of(state)))
        except baton_locks.Error as e:
            logging.info("watch %s ended: %s", wid, e)

    async def watch_lost(self, gid: str, held: Union[AsyncHeld, AsyncCampaign]) -> None:
        while held.is_held():
            try:
                await asyncio.wait_for(held.lost.wait(), 0.5)
            except asyncio.TimeoutError:
                pass
        if held.lost.is_set():
            emit({"event": "lost", "grant": gid})

    async def run_one(self, req: Json) -> None:
        rid = req.get("id")
        try:
            ok = await self.handle(req)
            if ok is not None:
                emit({"id": rid, "ok": ok})
        except Exception as e:  # every error is answered, never fatal
            emit({"id": rid, "error": error_of(e)})

    async def close_all(self) -> None:
        """At the end: close every client (bounded), then give the
        requests still running (failing ``closed`` now) a moment to
        answer."""
        closes = [c.close() for c in self.clients.values()]
        if closes:
            try:
                await asyncio.wait_for(asyncio.gather(*closes, return_exceptions=True), 1.2)
            except asyncio.TimeoutError:
                pass
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=0.3)


# --- the main loops -------------------------------------------------------


def parse(line: str) -> Tuple[Optional[Json], Optional[Json]]:
    """The request, or the answer to a line that is not one."""
    try:
        req = json.loads(line)
    except ValueError as e:
        return None, {"id": None, "error": {"kind": "bad-argument", "detail": "not JSON: %s" % e}}
    if not isinstance(req, dict) or not isinstance(req.get("id"), int) or isinstance(req.get("id"), bool):
        rid = req.get("id") if isinstance(req, dict) else None
        return None, {"id": rid, "error": {"kind": "bad-argument", "detail": "a request is an object with an integer id"}}
    return req, None


def ready(cancel: bool) -> None:
    line: Json = {"ready": True, "client": CLIENT_NAME, "version": baton_locks.__version__}
    if not cancel:
        # A blocking call gives up only at the end of its own wait.
        line["cancel"] = False
    emit(line)


CLIENT_NAME = "python"


def main_sync() -> None:
    driver = SyncDriver()
    ready(cancel=False)
    for line in sys.stdin:
        if not line.strip():
            continue
        req, bad = parse(line)
        if bad is not None:
            emit(bad)
            continue
        assert req is not None
        if req.get("cmd") == "exit":
            driver.close_all()
            emit({"id": req["id"], "ok": {}})
            return
        thread = threading.Thread(target=driver.run_one, args=(req,), daemon=True)
        driver.running.add(thread)
        thread.start()
    driver.close_all()


async def main_async() -> None:
    driver = AsyncDriver()
    loop = asyncio.get_running_loop()
    lines: "asyncio.Queue[Optional[str]]" = asyncio.Queue()

    def read() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(lines.put_nowait, line)
        loop.call_soon_threadsafe(lines.put_nowait, None)

    # stdin is read on a thread of the driver's own (not the client's).
    threading.Thread(target=read, daemon=True).start()
    ready(cancel=True)
    while True:
        line = await lines.get()
        if line is None:
            break
        if not line.strip():
            continue
        req, bad = parse(line)
        if bad is not None:
            emit(bad)
            continue
        assert req is not None
        if req.get("cmd") == "exit":
            await driver.close_all()
            emit({"id": req["id"], "ok": {}})
            return
        driver.spawn(driver.run_one(req))
    await driver.close_all()


def main(argv: Optional[list] = None) -> None:  # type: ignore[type-arg]
    global CLIENT_NAME
    args = sys.argv[1:] if argv is None else argv
    logging.basicConfig(stream=sys.stderr, level=os.environ.get("BATON_DRIVER_LOG", "WARNING"))
    if "--asyncio" in args:
        CLIENT_NAME = "python-asyncio"
        try:
            asyncio.run(main_async())
        except Exception:
            logging.exception("driver failed")
    else:
        main_sync()
    sys.stdout.flush()
    sys.stderr.flush()
    # Exit now: never wait on a thread of anything that did not end.
    os._exit(0)


if __name__ == "__main__":
    main()
