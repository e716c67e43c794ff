package dev.baton;

import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.function.Supplier;

/**
 * The calls: how one request becomes one result, across dropped
 * connections, redirects and deadlines. Every call is a small state machine
 * driven by completions (an answer, a dropped connection, a deadline or a
 * pause on the scheduler); the blocking API waits on its future, so each
 * rule is written once:
 * <ul>
 * <li>an attempt whose connection drops moves to the next connection; the
 * call fails only after as many failed attempts as there are registered
 * connections ({@code E <op> <key> shutting-down} counts as failed);</li>
 * <li>{@code M host:port}: prefer that node (registering it if new) and send
 * again; {@code M -}, or a node that is down: wait 100 ms and send again, for
 * up to the request timeout; at most 8 redirects per call;</li>
 * <li>a connection has the request timeout to answer (an acquire: its wait
 * plus the request timeout; one without a wait limit: no limit), else it is
 * closed and the call fails unavailable; that clock starts when the request
 * reaches the front of its (op, key) line on its connection (the server
 * holds back the answer to an acquire sent behind an earlier acquire of the
 * same key there, even a {@code T}), and an acquire still held back at its
 * caller's deadline fails with a timeout (its wait ran out long before; a
 * grant that comes later is released), never closing the connection;</li>
 * <li>a grant answered after more than a third of its lease is confirmed at
 * once with {@code K};</li>
 * <li>a release is retried for 5 s at 200 ms while no connection can carry
 * it; {@code N} after an attempt that may have reached the server counts as
 * released.</li>
 * </ul>
 */
final class Calls {
    /** Deadlines closer than this are one: see {@code overdue}. */
    private static final long SAME_DEADLINE_NANOS = TimeUnit.MILLISECONDS.toNanos(10);

    private Calls() {}

    static final long RELEASE_RETRY_WINDOW_MS = 5000;
    static final long RELEASE_RETRY_INTERVAL_MS = 200;
    static final long NO_ACTIVE_RETRY_MS = 100;
    static final int MAX_REDIRECTS = 8;
    static final int ACQUIRE_ROUNDS = 3;

    static long ms(long millis) {
        return TimeUnit.MILLISECONDS.toNanos(millis);
    }

    /** A final answer, when its request was sent, and whether an earlier attempt may have reached a server. */
    record Exchanged(Wire.Answer answer, long sentAt, boolean earlierMaybeDelivered) {}

    /** A call that got no final answer. */
    static final class Failure extends RuntimeException {
        private static final long serialVersionUID = 1L;
        final BatonException error;
        final boolean maybeDelivered;

        Failure(BatonException error, boolean maybeDelivered) {
            super(error.getMessage(), null, false, false);
            this.error = error;
            this.maybeDelivered = maybeDelivered;
        }
    }

    /** The BatonException inside whatever a future failed with. */
    static BatonException error(Throwable e) {
        while ((e instanceof CompletionException || e instanceof java.util.concurrent.ExecutionException)
            && e.getCause() != null) {
            e = e.getCause();
        }
        if (e instanceof Failure) {
            return ((Failure) e).error;
        }
        if (e instanceof BatonException) {
            return (BatonException) e;
        }
        if (e instanceof java.util.concurrent.CancellationException) {
            return new BatonException("cancelled", e);
        }
        return new BatonException("unexpected: " + e, e);
    }

    static BatonException unexpected(Wire.Answer a) {
        return new UnavailableException("unexpected answer: " + Wire.abbreviate(a.text));
    }

    /** Which deadline of a request still unanswered has passed: see {@link #pastDeadline}. */
    enum Verdict { NOT_YET, CONN_OVERDUE, CALLER_OVERDUE, HELD_BACK }

    /**
     * At {@code now}, for a request that reached the front of its (op, key)
     * line on its connection at {@code frontAt} (when {@code atFront}; else it
     * is held back behind an earlier one), with the connection's budget
     * ({@code budgetNanos}, -1: no limit) and the caller's deadline
     * ({@code due}, {@link Pool#NONE}: none): CONN_OVERDUE (the connection is
     * deemed dead), CALLER_OVERDUE, HELD_BACK (the caller's deadline, while
     * the server was entitled to hold the answer back), or NOT_YET. Pure.
     * The caller's deadline is taken just before the send, the connection's
     * just after it: for a request whose budget is the request timeout they
     * differ by the send's microseconds, and the connection is as overdue as
     * the caller (it is closed and reconnected, as every official client
     * does).
     */
    static Verdict pastDeadline(long now, long budgetNanos, boolean atFront, long frontAt, long due) {
        if (budgetNanos >= 0 && atFront && now - deadline(frontAt, budgetNanos) >= -SAME_DEADLINE_NANOS) {
            return Verdict.CONN_OVERDUE;
        }
        if (due != Pool.NONE && now - due >= 0) {
            return atFront ? Verdict.CALLER_OVERDUE : Verdict.HELD_BACK;
        }
        return Verdict.NOT_YET;
    }

    static long deadline(long fromNanos, long addNanos) {
        return fromNanos + addNanos < fromNanos ? Pool.NONE : fromNanos + addNanos;
    }

    /** One exchange: send the request {@code make} builds (again on each attempt) until a final answer comes. */
    static final class Exchange {
        private final Pool pool;
        private final long due;
        private final Supplier<Wire.Request> make;
        private int failures;
        private boolean delivered;
        private int hops;
        private long waitingSince = -1;
        private volatile Conn.Ticket current;
        /** The current attempt's next look at its deadlines. */
        private volatile ScheduledFuture<?> timer;
        final CompletableFuture<Exchanged> result = new CompletableFuture<>();

        Exchange(Pool pool, long due, Supplier<Wire.Request> make) {
            this.pool = pool;
            this.due = due;
            this.make = make;
            result.whenComplete((v, e) -> {
                if (result.isCancelled()) {
                    Conn.Ticket t = current;
                    if (t != null) {
                        t.future.cancel(false);
                    }
                }
            });
        }

        CompletableFuture<Exchanged> start() {
            next();
            return result;
        }

        private void fail(BatonException e) {
            result.completeExceptionally(new Failure(e, delivered));
        }

        private void next() {
            if (result.isDone()) {
                return;
            }
            if (pool.isClosed()) {
                fail(new ClosedException("the client is closed"));
                return;
            }
            Wire.Request request;
            try {
                request = make.get();
            } catch (BatonException e) {
                fail(e);
                return;
            }
            pool.pick(due, request.op() == 'A' ? request.key() : null).whenComplete((conn, err) -> {
                if (err != null) {
                    fail(error(err));
                } else {
                    send(conn, request);
                }
            });
        }

        private void send(Conn conn, Wire.Request request) {
            if (result.isDone()) {
                return;
            }
            Conn.Ticket t = conn.send(request);
            if (t == null) {
                lost(false);
                return;
            }
            current = t;
            if (result.isCancelled()) {
                t.future.cancel(false);
            }
            long budget = request.budgetMs(pool.requestTimeoutMs);
            watch(t, budget < 0 ? -1 : ms(budget), request.op());
            t.future.whenComplete((answer, e) -> {
                ScheduledFuture<?> timer = this.timer;
                if (timer != null) {
                    timer.cancel(false);
                }
                if (e == null) {
                    answered(answer, t.sentAt);
                } else if (e instanceof ClosedException) {
                    fail((ClosedException) e); // a grant close took (Conn#dispatch)
                } else if (!t.future.isCancelled()) {
                    lost(true);
                }
            });
        }

        /**
         * Look at {@code t} again at the earlier of the caller's deadline and
         * the connection's ({@code budgetNanos}, -1: none, from when the
         * request reached the front of its (op, key) line; while it is held
         * back, a budget from now).
         */
        private void watch(Conn.Ticket t, long budgetNanos, char op) {
            long check = Pool.NONE;
            if (budgetNanos >= 0) {
                check = deadline(t.atFront() ? t.frontAt() : System.nanoTime(), budgetNanos);
            }
            long until = Math.min(check, due);
            if (until == Pool.NONE) {
                return;
            }
            timer = pool.schedule(() -> onDeadline(t, budgetNanos, op), until - System.nanoTime());
            if (t.future.isDone() && timer != null) {
                timer.cancel(false);
            }
        }

        private void onDeadline(Conn.Ticket t, long budgetNanos, char op) {
            if (t.future.isDone()) {
                return;
            }
            boolean atFront = t.atFront();
            switch (pastDeadline(System.nanoTime(), budgetNanos, atFront, atFront ? t.frontAt() : 0, due)) {
                case CONN_OVERDUE -> overdue(t, true);
                case CALLER_OVERDUE -> overdue(t, false);
                case HELD_BACK -> {
                    if (op == 'A') {
                        heldBack(t);
                    } else {
                        overdue(t, false);
                    }
                }
                default -> watch(t, budgetNanos, op);
            }
        }

        private void overdue(Conn.Ticket t, boolean kill) {
            if (!t.future.cancel(false)) {
                return; // answered after all
            }
            long waited = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t.sentAt);
            String why = t.conn.addr + " did not answer within " + waited + " ms";
            if (kill) {
                t.conn.kill(t.generation, "no answer within " + waited + " ms");
            }
            delivered = true;
            fail(new UnavailableException("no answer: " + why));
        }

        /** Its wait ran out long ago: the answer held back is a T (a grant that comes instead is released). */
        private void heldBack(Conn.Ticket t) {
            if (!t.future.cancel(false)) {
                return; // answered after all
            }
            delivered = true;
            fail(new BatonTimeoutException("timed out: the key was not granted within the wait"));
        }

        private void answered(Wire.Answer a, long sentAt) {
            if (a.tag == 'M') {
                follow(a.active);
                return;
            }
            if (a.tag == 'E' && "shutting-down".equals(a.reason)) {
                failures++;
                afterFailure();
                return;
            }
            if (!result.complete(new Exchanged(a, sentAt, delivered)) && a.tag == 'A') {
                // Its caller gave up as the grant came: nobody will get it.
                releaseInHand(pool, a.key, a.token);
            }
        }

        private void lost(boolean sent) {
            delivered |= sent;
            failures++;
            afterFailure();
        }

        private void afterFailure() {
            if (pool.isClosed()) {
                fail(new ClosedException("the client is closed"));
                return;
            }
            if (failures < pool.connectionCount()) {
                next();
                return;
            }
            fail(pool.noConnection("the connection failed on each of " + failures + " attempts: "));
        }

        private void follow(String active) {
            if (active != null) {
                int node;
                try {
                    node = pool.nodeFor(active);
                } catch (BatonException e) {
                    fail(e);
                    return;
                }
                if (pool.isReachable(node)) {
                    hops++;
                    if (hops > MAX_REDIRECTS) {
                        fail(new UnavailableException("no active node: redirected " + MAX_REDIRECTS
                            + " times without reaching the active node (last: " + active + ")"));
                        return;
                    }
                    pool.prefer(node);
                    waitingSince = -1;
                    next();
                    return;
                }
            }
            long now = System.nanoTime();
            if (waitingSince < 0) {
                waitingSince = now;
            }
            long wake = now + ms(NO_ACTIVE_RETRY_MS);
            if (now - waitingSince >= ms(pool.requestTimeoutMs) || wake - due >= 0 && due != Pool.NONE) {
                fail(new UnavailableException(active != null
                    ? "no active node: redirected to " + active + ", which cannot be reached"
                    : "no active node: the servers know no active node (waited "
                        + TimeUnit.NANOSECONDS.toMillis(now - waitingSince) + " ms)"));
                return;
            }
            pool.schedule(this::next, ms(NO_ACTIVE_RETRY_MS));
        }
    }

    static CompletableFuture<Exchanged> exchange(Pool pool, long due, Supplier<Wire.Request> make) {
        return new Exchange(pool, due, make).start();
    }

    // ---- acquire ----

    /** A grant as it arrived: key, token, slot, lease and when the request that got it was sent. */
    static final class Granted {
        final String key;
        final long token;
        final int slot;
        final long leaseMs;
        long leaseStart;

        Granted(String key, long token, int slot, long leaseMs, long leaseStart) {
            this.key = key;
            this.token = token;
            this.slot = slot;
            this.leaseMs = leaseMs;
            this.leaseStart = leaseStart;
        }
    }

    /** {@code A key lease wait [limit [value]]}; a re-sent acquire asks only for the wait that is left. */
    static final class Acquire {
        private final Pool pool;
        private final String key;
        private final long leaseMs;
        private final long waitMs;
        private final Integer limit;
        private final String value;
        private final long waitEnd;
        private int rounds;
        private volatile CompletableFuture<Exchanged> current;
        final CompletableFuture<Granted> result = new CompletableFuture<>();

        Acquire(Pool pool, String key, long leaseMs, long waitMs, Integer limit, String value) {
            this.pool = pool;
            this.key = key;
            this.leaseMs = leaseMs;
            this.waitMs = waitMs;
            this.limit = limit;
            this.value = value;
            this.waitEnd = waitMs == 0 ? Pool.NONE : deadline(System.nanoTime(), ms(waitMs));
            result.whenComplete((g, e) -> {
                if (result.isCancelled()) {
                    CompletableFuture<Exchanged> c = current;
                    if (c != null) {
                        c.cancel(false);
                    }
                }
            });
        }

        CompletableFuture<Granted> start() {
            round();
            return result;
        }

        private Wire.Request request() {
            if (pool.isClosing()) {
                throw new ClosedException("the client is closed");
            }
            long left = 0;
            if (waitMs != 0) {
                long nanos = waitEnd - System.nanoTime();
                if (nanos <= 0) {
                    throw new BatonTimeoutException("timed out: " + key + " was not granted within the wait");
                }
                left = Math.max(1, (nanos + 999_999) / 1_000_000);
            }
            return Wire.acquire(key, leaseMs, left, limit, value);
        }

        private void round() {
            if (rounds++ >= ACQUIRE_ROUNDS) {
                result.completeExceptionally(new UnavailableException(
                    "grants of " + key + " ran out before they arrived, " + ACQUIRE_ROUNDS + " times"));
                return;
            }
            long due = waitEnd == Pool.NONE ? Pool.NONE : deadline(waitEnd, ms(pool.requestTimeoutMs));
            Exchange ex = new Exchange(pool, due, this::request);
            current = ex.result;
            if (result.isCancelled()) {
                ex.result.cancel(false);
                return;
            }
            ex.start().whenComplete((done, err) -> {
                if (err != null) {
                    result.completeExceptionally(error(err));
                } else {
                    answered(done);
                }
            });
        }

        /*
         * A grant is in hand (counted by the pool) from when its connection
         * delivered it until this call hands it to its caller (then the
         * pool.handOut() in deliver) or releases it (releaseInHand). Found
         * closing once it has the grant, or once its K is answered, the call
         * releases the grant itself and then fails closed; close waits for
         * that before it settles and closes the connections.
         */
        private void answered(Exchanged done) {
            Wire.Answer a = done.answer();
            switch (a.tag) {
                case 'A':
                    Granted g = new Granted(a.key, a.token, Math.max(0, a.slot), leaseMs, done.sentAt());
                    if (pool.isClosing()) {
                        closing(g);
                    } else if (System.nanoTime() - g.leaseStart > ms(leaseMs) / 3) {
                        confirm(g);
                    } else {
                        deliver(g);
                    }
                    return;
                case 'T':
                    result.completeExceptionally(
                        new BatonTimeoutException("timed out: " + key + " was not granted within the wait"));
                    return;
                case 'E':
                    result.completeExceptionally(new RefusedException(a.reason, "refused by the server: " + a.reason));
                    return;
                default:
                    result.completeExceptionally(unexpected(a));
            }
        }

        /** A grant that waited in line: restart its lease with K before the caller gets it. */
        private void confirm(Granted g) {
            if (result.isDone()) {
                releaseInHand(pool, g.key, g.token);
                return;
            }
            long due = System.nanoTime() + ms(pool.requestTimeoutMs);
            exchange(pool, due, () -> Wire.keep(g.key, g.token, leaseMs)).whenComplete((done, err) -> {
                if (err == null && done.answer().tag == 'K') {
                    g.leaseStart = done.sentAt();
                } else if (err == null && done.answer().tag == 'E' && "not-held".equals(done.answer().reason)) {
                    pool.handOut(); // nothing to release
                    if (pool.isClosing()) {
                        result.completeExceptionally(new ClosedException("the client is closed"));
                    } else {
                        round(); // it ran out before it arrived: ask again
                    }
                    return;
                }
                deliver(g);
            });
        }

        private void deliver(Granted g) {
            if (pool.isClosing()) {
                closing(g);
            } else if (result.complete(g)) {
                pool.handOut(); // its caller's now (a hold's registered: it ran in complete)
            } else {
                releaseInHand(pool, g.key, g.token);
            }
        }

        /** The client is closing: release the grant, then fail the call. */
        private void closing(Granted g) {
            releaseInHand(pool, g.key, g.token).whenComplete(
                (v, e) -> result.completeExceptionally(new ClosedException("the client is closed")));
        }
    }

    /**
     * A grant in hand nobody will get (its caller gave up, or the client is
     * closing): release it, then end its count (close waits for that, and
     * keeps the connections open meanwhile).
     */
    static CompletableFuture<Void> releaseInHand(Pool pool, String key, long token) {
        return release(pool, key, token).handle((released, e) -> {
            pool.handOut();
            return null;
        });
    }

    // ---- release ----

    /** {@code R key token}, retried while no connection can carry it; true: released, false: not held. */
    static CompletableFuture<Boolean> release(Pool pool, String key, long token) {
        return new Release(pool, key, token).attempt();
    }

    private static final class Release {
        private final Pool pool;
        private final String key;
        private final long token;
        private final long retryEnd = System.nanoTime() + ms(RELEASE_RETRY_WINDOW_MS);
        private boolean delivered;
        final CompletableFuture<Boolean> result = new CompletableFuture<>();

        Release(Pool pool, String key, long token) {
            this.pool = pool;
            this.key = key;
            this.token = token;
        }

        CompletableFuture<Boolean> attempt() {
            long due = deadline(retryEnd, ms(pool.requestTimeoutMs));
            exchange(pool, due, () -> Wire.release(key, token)).whenComplete((done, err) -> {
                if (err == null) {
                    outcome(done);
                    return;
                }
                Failure f = err instanceof Failure ? (Failure) err : new Failure(error(err), true);
                delivered |= f.maybeDelivered;
                boolean late = System.nanoTime() + ms(RELEASE_RETRY_INTERVAL_MS) - retryEnd > 0;
                if (late || !(f.error instanceof UnavailableException)) {
                    result.completeExceptionally(f.error);
                    return;
                }
                if (pool.schedule(this::attempt, ms(RELEASE_RETRY_INTERVAL_MS)) == null) {
                    result.completeExceptionally(new ClosedException("the client is closed"));
                }
            });
            return result;
        }

        private void outcome(Exchanged done) {
            boolean maybe = delivered || done.earlierMaybeDelivered();
            Wire.Answer a = done.answer();
            switch (a.tag) {
                case 'R':
                    result.complete(true);
                    return;
                case 'N':
                    result.complete(maybe);
                    return;
                case 'E':
                    result.completeExceptionally(new RefusedException(a.reason, "refused by the server: " + a.reason));
                    return;
                default:
                    result.completeExceptionally(unexpected(a));
            }
        }
    }

    /** The release outcome rule, for tests: N counts as released after an attempt that may have got through. */
    static boolean releasedBy(char tag, boolean maybeDelivered) {
        return tag == 'R' || (tag == 'N' && maybeDelivered);
    }

    // ---- keep, query ----

    /** {@code K key token lease}, answered until {@code due}; completes with when the keep that got through was sent. */
    static CompletableFuture<Long> keep(Pool pool, String key, long token, long leaseMs, long due) {
        return exchange(pool, due, () -> Wire.keep(key, token, leaseMs)).handle((done, err) -> {
            if (err != null) {
                throw error(err);
            }
            Wire.Answer a = done.answer();
            if (a.tag == 'K') {
                return done.sentAt();
            }
            if (a.tag == 'E' && "not-held".equals(a.reason)) {
                throw new LostException("lost " + key + " (token " + Long.toUnsignedString(token)
                    + "): the server no longer holds it");
            }
            if (a.tag == 'E') {
                throw new RefusedException(a.reason, "refused by the server: " + a.reason);
            }
            throw unexpected(a);
        });
    }

    /** {@code Q key}. */
    static CompletableFuture<KeyStatus> query(Pool pool, String key) {
        long due = System.nanoTime() + ms(pool.requestTimeoutMs);
        return exchange(pool, due, () -> Wire.query(key)).handle((done, err) -> {
            if (err != null) {
                throw error(err);
            }
            Wire.Answer a = done.answer();
            if (a.tag == 'Q') {
                return new KeyStatus(a.key, a.token, java.time.Duration.ofMillis(a.msLeft), a.waiting);
            }
            if (a.tag == 'E') {
                throw new RefusedException(a.reason, "refused by the server: " + a.reason);
            }
            throw unexpected(a);
        });
    }
}
