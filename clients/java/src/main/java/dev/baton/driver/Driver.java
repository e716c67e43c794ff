package dev.baton.driver;

import dev.baton.AcquireOptions;
import dev.baton.BatonArgumentException;
import dev.baton.BatonClient;
import dev.baton.BatonException;
import dev.baton.BatonTimeoutException;
import dev.baton.BatonTls;
import dev.baton.ClosedException;
import dev.baton.Grant;
import dev.baton.HeldGrant;
import dev.baton.LostException;
import dev.baton.RefusedException;
import dev.baton.UnavailableException;
import dev.baton.Watch;
import dev.baton.WatchListener;
import dev.baton.WatchState;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.io.PrintStream;
import java.math.BigDecimal;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Consumer;
import javax.net.ssl.SSLContext;

/**
 * The conformance driver of the Java client (the baton spec, section 10): JSON
 * requests on stdin, one per line; JSON answers and events on stdout, one per
 * line. {@code --async} drives the {@code CompletableFuture} forms (client
 * {@code java-async}); without it, the blocking calls, a thread per request
 * (client {@code java}). A thin adapter over the public API.
 */
public final class Driver {
    private final boolean async;
    private final PrintStream out;
    private final Map<String, BatonClient> clients = new ConcurrentHashMap<>();
    private final Map<String, Grant> grants = new ConcurrentHashMap<>();
    private final Map<String, Watch> watches = new ConcurrentHashMap<>();
    private final AtomicLong ids = new AtomicLong();
    private final ExecutorService workers = Executors.newCachedThreadPool(r -> {
        Thread t = new Thread(r, "driver-request");
        t.setDaemon(true);
        return t;
    });

    /** Gives calls up at their {@code cancel_after_ms}. */
    private final ScheduledExecutorService canceller = Executors.newSingleThreadScheduledExecutor(r -> {
        Thread t = new Thread(r, "driver-cancel");
        t.setDaemon(true);
        return t;
    });

    private Driver(boolean async, OutputStream stdout) {
        this.async = async;
        this.out = new PrintStream(stdout, false, StandardCharsets.UTF_8);
    }

    /**
     * Run the driver until the end of stdin or {@code exit}.
     *
     * @param args {@code --async} for the CompletableFuture forms
     * @throws IOException when stdin cannot be read
     */
    public static void main(String[] args) throws IOException {
        boolean async = List.of(args).contains("--async");
        Driver d = new Driver(async, new java.io.FileOutputStream(java.io.FileDescriptor.out));
        d.emit(Json.obj("ready", true, "client", async ? "java-async" : "java", "version", BatonClient.VERSION,
            "cancel", true));
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isBlank()) {
                continue;
            }
            if (d.handle(line)) {
                break;
            }
        }
        d.shutdown();
    }

    private void emit(Map<String, Object> message) {
        String text = Json.write(message);
        synchronized (out) {
            out.print(text);
            out.print('\n');
            out.flush();
        }
    }

    private void ok(Object id, Map<String, Object> body) {
        emit(Json.obj("id", id, "ok", body));
    }

    private void error(Object id, String kind, String detail) {
        emit(Json.obj("id", id, "error", Json.obj("kind", kind, "detail", detail == null ? "" : detail)));
    }

    private void fail(Object id, Throwable e) {
        while (e instanceof java.util.concurrent.CompletionException && e.getCause() != null) {
            e = e.getCause();
        }
        if (e instanceof java.util.concurrent.CancellationException) {
            error(id, "timeout", "cancelled");
        } else if (e instanceof RefusedException) {
            error(id, "refused", ((RefusedException) e).reason());
        } else if (e instanceof BatonTimeoutException) {
            error(id, "timeout", e.getMessage());
        } else if (e instanceof LostException) {
            error(id, "lost", e.getMessage());
        } else if (e instanceof ClosedException) {
            error(id, "closed", e.getMessage());
        } else if (e instanceof BatonArgumentException || e instanceof BadRequest) {
            error(id, "bad-argument", e.getMessage());
        } else if (e instanceof UnavailableException || e instanceof BatonException) {
            error(id, "unavailable", e.getMessage());
        } else {
            error(id, "bad-argument", String.valueOf(e));
        }
    }

    /** A request whose fields do not fit. */
    private static final class BadRequest extends RuntimeException {
        private static final long serialVersionUID = 1L;

        BadRequest(String message) {
            super(message);
        }
    }

    /** True when the driver is to exit. */
    @SuppressWarnings("unchecked")
    private boolean handle(String line) {
        Object parsed;
        try {
            parsed = Json.parse(line);
        } catch (Json.Bad e) {
            error(null, "bad-argument", "not JSON: " + e.getMessage());
            return false;
        }
        if (!(parsed instanceof Map)) {
            error(null, "bad-argument", "a request is a JSON object");
            return false;
        }
        Map<String, Object> req = (Map<String, Object>) parsed;
        Object id = req.get("id");
        if (!(id instanceof BigDecimal) || !isInteger((BigDecimal) id)) {
            error(id instanceof BigDecimal || id instanceof String ? id : null, "bad-argument",
                "a request has an integer id");
            return false;
        }
        Object idOut = ((BigDecimal) id).toBigInteger();
        Object cmd = req.get("cmd");
        if ("exit".equals(cmd)) {
            ok(idOut, Json.obj());
            return true;
        }
        Runnable run = () -> {
            try {
                dispatch(idOut, String.valueOf(cmd), req);
            } catch (BadRequest | BatonException e) {
                fail(idOut, e);
            } catch (InterruptedException e) {
                error(idOut, "unavailable", "interrupted");
            } catch (RuntimeException e) {
                error(idOut, "bad-argument", String.valueOf(e));
            }
        };
        boolean quick = "connect".equals(cmd) || "watch".equals(cmd) || "unwatch".equals(cmd);
        if (quick || async && !"close".equals(cmd)) {
            run.run();
        } else {
            workers.execute(run);
        }
        return false;
    }

    private static boolean isInteger(BigDecimal n) {
        return n.signum() == 0 || n.stripTrailingZeros().scale() <= 0;
    }

    private void dispatch(Object id, String cmd, Map<String, Object> req) throws InterruptedException {
        switch (cmd) {
            case "connect":
                connect(id, req);
                return;
            case "acquire":
            case "hold":
            case "campaign":
                acquire(id, cmd, req);
                return;
            case "release": {
                Grant g = grant(req);
                if (async) {
                    answer(id, g.releaseAsync(), v -> Json.obj());
                } else {
                    g.release();
                    ok(id, Json.obj());
                }
                return;
            }
            case "keep": {
                Grant g = grant(req);
                Duration lease = Duration.ofMillis(integer(req, "lease_ms", true));
                if (async) {
                    answer(id, g.keepAsync(lease), v -> Json.obj());
                } else {
                    g.keep(lease);
                    ok(id, Json.obj());
                }
                return;
            }
            case "query": {
                BatonClient c = client(req);
                String key = string(req, "key", true);
                if (async) {
                    answer(id, c.queryAsync(key), s -> Json.obj("token", s.tokenString(),
                        "ms_left", s.timeLeft().toMillis(), "waiting", s.waiting()));
                } else {
                    var s = c.query(key);
                    ok(id, Json.obj("token", s.tokenString(), "ms_left", s.timeLeft().toMillis(),
                        "waiting", s.waiting()));
                }
                return;
            }
            case "leader": {
                BatonClient c = client(req);
                String key = string(req, "key", true);
                if (async) {
                    answer(id, c.leaderAsync(key), Driver::state);
                } else {
                    ok(id, state(c.leader(key)));
                }
                return;
            }
            case "watch":
                watch(id, req);
                return;
            case "unwatch": {
                String w = string(req, "watch", true);
                Watch watch = watches.remove(w);
                if (watch == null) {
                    throw new BadRequest("no watch " + w);
                }
                watch.close();
                ok(id, Json.obj());
                return;
            }
            case "close": {
                BatonClient c = client(req);
                c.close();
                ok(id, Json.obj());
                return;
            }
            default:
                throw new BadRequest("unknown cmd " + cmd);
        }
    }

    private <T> void answer(Object id, CompletableFuture<T> f, java.util.function.Function<T, Map<String, Object>> body) {
        f.whenComplete((v, e) -> {
            if (e != null) {
                fail(id, e);
            } else {
                ok(id, body.apply(v));
            }
        });
    }

    private static Map<String, Object> state(WatchState s) {
        return Json.obj("token", s.tokenString(), "holders", s.holders(), "waiting", s.waiting(), "value", s.value());
    }

    private void connect(Object id, Map<String, Object> req) {
        Object addrs = req.get("addrs");
        if (!(addrs instanceof List)) {
            throw new BadRequest("addrs is a list of host:port");
        }
        List<String> list = new ArrayList<>();
        for (Object a : (List<?>) addrs) {
            if (!(a instanceof String)) {
                throw new BadRequest("addrs is a list of host:port");
            }
            list.add((String) a);
        }
        BatonClient.Builder b = BatonClient.builder(list);
        String auth = string(req, "auth", false);
        if (auth != null) {
            b.auth(auth);
        }
        Object tls = req.get("tls");
        if (tls != null) {
            if (!(tls instanceof Map)) {
                throw new BadRequest("tls is an object");
            }
            Map<?, ?> t = (Map<?, ?>) tls;
            SSLContext ctx = BatonTls.context(path(t.get("ca")), path(t.get("cert")), path(t.get("key")));
            b.tls(ctx);
        }
        BatonClient c = b.build();
        String name = "c" + ids.incrementAndGet();
        clients.put(name, c);
        ok(id, Json.obj("client", name));
    }

    private static Path path(Object o) {
        if (o == null) {
            return null;
        }
        if (!(o instanceof String)) {
            throw new BadRequest("a TLS file is a path");
        }
        return Path.of((String) o);
    }

    /** Buffers a grant's or watch's events until its answer is written. */
    private final class Gate {
        private final List<Map<String, Object>> held = new ArrayList<>();
        private boolean open;

        synchronized void event(Map<String, Object> e) {
            if (open) {
                emit(e);
            } else {
                held.add(e);
            }
        }

        synchronized void open(Runnable answer) {
            answer.run();
            for (Map<String, Object> e : held) {
                emit(e);
            }
            held.clear();
            open = true;
        }
    }

    private void acquire(Object id, String cmd, Map<String, Object> req) throws InterruptedException {
        BatonClient c = client(req);
        String key = string(req, "key", true);
        Duration lease = Duration.ofMillis(integer(req, "lease_ms", true));
        Long waitMs = integer(req, "wait_ms", false);
        Duration wait = waitMs == null ? null : Duration.ofMillis(waitMs);
        AcquireOptions options = AcquireOptions.none();
        String value = string(req, "value", "campaign".equals(cmd));
        Long limit = integer(req, "limit", false);
        if (limit != null) {
            if (limit < Integer.MIN_VALUE || limit > Integer.MAX_VALUE) {
                throw new BatonArgumentException("bad limit " + limit);
            }
            options = options.limit(limit.intValue());
        }
        if (value != null && !"campaign".equals(cmd)) {
            options = options.value(value);
        }
        Long cancelAfter = integer(req, "cancel_after_ms", false);
        String name = "g" + ids.incrementAndGet();
        Gate gate = new Gate();
        Consumer<LostException> onLost = e -> gate.event(Json.obj("event", "lost", "grant", name));
        if (async) {
            CompletableFuture<? extends Grant> f;
            switch (cmd) {
                case "acquire":
                    f = c.acquireAsync(key, lease, wait, options);
                    break;
                case "hold":
                    f = c.holdAsync(key, lease, wait, options, onLost);
                    break;
                default:
                    f = c.campaignAsync(key, value, lease, wait, onLost);
            }
            if (cancelAfter != null) {
                // The future's own cancel: a grant that arrives later is the client's to release.
                canceller.schedule(() -> f.cancel(true), cancelAfter, TimeUnit.MILLISECONDS);
            }
            f.whenComplete((g, e) -> {
                if (e != null) {
                    fail(id, e);
                    return;
                }
                grants.put(name, g);
                gate.open(() -> ok(id, granted(name, g)));
            });
            return;
        }
        Grant g;
        Interrupter interrupter = cancelAfter == null ? null : new Interrupter(Thread.currentThread());
        if (interrupter != null) {
            canceller.schedule(interrupter::fire, cancelAfter, TimeUnit.MILLISECONDS);
        }
        try {
            switch (cmd) {
                case "acquire":
                    g = c.acquire(key, lease, wait, options);
                    break;
                case "hold":
                    g = c.hold(key, lease, wait, options, onLost);
                    break;
                default:
                    HeldGrant h = c.campaign(key, value, lease, wait, onLost);
                    g = h;
            }
        } catch (InterruptedException e) {
            if (interrupter != null && interrupter.fired()) {
                error(id, "timeout", "cancelled");
                return;
            }
            throw e;
        } finally {
            if (interrupter != null) {
                interrupter.disarm();
            }
        }
        grants.put(name, g);
        Grant done = g;
        gate.open(() -> ok(id, granted(name, done)));
    }

    /**
     * Interrupts a blocking call's thread at its {@code cancel_after_ms}, only while that call
     * runs: the worker thread goes back to the pool afterwards and must not be interrupted then.
     */
    private static final class Interrupter {
        private final Thread thread;
        private boolean armed = true;
        private boolean fired;

        Interrupter(Thread thread) {
            this.thread = thread;
        }

        synchronized void fire() {
            if (armed) {
                fired = true;
                thread.interrupt();
            }
        }

        synchronized boolean fired() {
            return fired;
        }

        synchronized void disarm() {
            armed = false;
            if (fired) {
                Thread.interrupted(); // clear a flag the call did not consume
            }
        }
    }

    private static Map<String, Object> granted(String name, Grant g) {
        return Json.obj("grant", name, "token", g.tokenString(), "slot", g.slot());
    }

    private void watch(Object id, Map<String, Object> req) {
        BatonClient c = client(req);
        String key = string(req, "key", true);
        String name = "w" + ids.incrementAndGet();
        Gate gate = new Gate();
        Watch w = c.watch(key, new WatchListener() {
            @Override
            public void onState(WatchState s) {
                Map<String, Object> e = Json.obj("event", "state", "watch", name);
                e.putAll(state(s));
                gate.event(e);
            }
        });
        watches.put(name, w);
        gate.open(() -> ok(id, Json.obj("watch", name)));
    }

    private BatonClient client(Map<String, Object> req) {
        String name = string(req, "client", true);
        BatonClient c = clients.get(name);
        if (c == null) {
            throw new BadRequest("no client " + name);
        }
        return c;
    }

    private Grant grant(Map<String, Object> req) {
        String name = string(req, "grant", true);
        Grant g = grants.get(name);
        if (g == null) {
            throw new BadRequest("no grant " + name);
        }
        return g;
    }

    private static String string(Map<String, Object> req, String field, boolean required) {
        Object v = req.get(field);
        if (v == null) {
            if (required) {
                throw new BadRequest(field + " is required");
            }
            return null;
        }
        if (!(v instanceof String)) {
            throw new BadRequest(field + " is a string");
        }
        return (String) v;
    }

    private static Long integer(Map<String, Object> req, String field, boolean required) {
        Object v = req.get(field);
        if (v == null) {
            if (required) {
                throw new BadRequest(field + " is required");
            }
            return null;
        }
        if (!(v instanceof BigDecimal) || !isInteger((BigDecimal) v)) {
            throw new BadRequest(field + " is an integer");
        }
        try {
            return ((BigDecimal) v).longValueExact();
        } catch (ArithmeticException e) {
            throw new BadRequest(field + " is out of range");
        }
    }

    private void shutdown() {
        List<Thread> closing = new ArrayList<>();
        for (BatonClient c : clients.values()) {
            Thread t = new Thread(c::close, "driver-close");
            t.setDaemon(true);
            t.start();
            closing.add(t);
        }
        long end = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(1500);
        for (Thread t : closing) {
            try {
                t.join(Math.max(1, TimeUnit.NANOSECONDS.toMillis(end - System.nanoTime())));
            } catch (InterruptedException e) {
                break;
            }
        }
        out.flush();
        Runtime.getRuntime().halt(0);
    }
}
