package dev.baton;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.List;
import java.util.Objects;
import java.util.Set;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Executor;
import java.util.concurrent.ForkJoinPool;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.Flow;
import java.util.function.Consumer;
import javax.net.ssl.SSLContext;

/**
 * A client of a baton service: one or more servers, each reached through
 * persistent connections kept up in the background (two when one address is
 * given, one per address otherwise), picked round-robin (an acquire of a key
 * goes to one with no acquire of that key outstanding when one is up, so that
 * a try-acquire never waits behind this client's own acquire of the key; when
 * every one up has one and another is still connecting, it waits for that one,
 * within the connect timeout),
 * reconnected every
 * 3 s after a drop, with requests from every thread pipelined on them.
 * Thread-safe: build one and share it. {@link #close()} stops every thread it
 * started.
 *
 * <pre>{@code
 * try (BatonClient client = BatonClient.builder("10.0.0.1:7373", "10.0.0.2:7373").build();
 *      Grant grant = client.acquire("invoices", Duration.ofSeconds(30), Duration.ofSeconds(10))) {
 *     writeInvoices(grant.tokenString()); // the store refuses tokens not above the last it accepted
 * }
 * }</pre>
 *
 * <p>Every blocking call has a deadline: an acquire waits at most its wait
 * plus the request timeout (without limit when it has no wait); other calls
 * the request timeout (a release up to 5 s more while it retries). Blocking
 * calls honour interruption ({@link InterruptedException}; an acquire given up
 * that way is released at once if its grant still arrives). Each has a
 * {@code *Async} form returning a {@link CompletableFuture}, completed on the
 * client's executor ({@link ForkJoinPool#commonPool()} unless
 * {@link Builder#executor} says otherwise); cancelling an acquire's future
 * gives it up, and a grant that arrives later is released at once.
 */
public final class BatonClient implements AutoCloseable {
    /** The default time to establish a connection (TCP, TLS and {@code U}). */
    public static final Duration DEFAULT_CONNECT_TIMEOUT = Duration.ofSeconds(2);
    /** The default time a server has to answer a request that does not wait in line. */
    public static final Duration DEFAULT_REQUEST_TIMEOUT = Duration.ofSeconds(5);
    /** This library's version. */
    public static final String VERSION = "0.1.0";

    final Pool pool;
    private volatile boolean closed;
    private final Set<HeldGrant> held = ConcurrentHashMap.newKeySet();
    private final Set<Watch> watches = ConcurrentHashMap.newKeySet();

    private BatonClient(Builder b, List<String> servers) {
        this.pool = new Pool(servers, b.connectTimeout.toMillis(), b.requestTimeout.toMillis(), b.secret, b.tls,
            b.executor);
    }

    /**
     * A builder for a client of these servers ({@code host:port} each; the
     * port defaults to 7373), in any order: the client finds the active node.
     *
     * @param addresses the servers
     * @return a builder
     */
    public static Builder builder(String... addresses) {
        return new Builder(Arrays.asList(addresses));
    }

    /**
     * A builder for a client of these servers.
     *
     * @param addresses the servers, {@code host:port} each
     * @return a builder
     */
    public static Builder builder(Collection<String> addresses) {
        return new Builder(new ArrayList<>(addresses));
    }

    /**
     * A client of these servers with the default settings.
     *
     * @param addresses the servers, {@code host:port} each
     * @return the client (connecting in the background)
     * @throws BatonArgumentException for a malformed address
     */
    public static BatonClient connect(String... addresses) {
        return builder(addresses).build();
    }

    /** Settings for a {@link BatonClient} beyond its servers. */
    public static final class Builder {
        private final List<String> servers;
        private Duration connectTimeout = DEFAULT_CONNECT_TIMEOUT;
        private Duration requestTimeout = DEFAULT_REQUEST_TIMEOUT;
        private String secret;
        private SSLContext tls;
        private Executor executor = ForkJoinPool.commonPool();

        private Builder(List<String> servers) {
            this.servers = servers;
        }

        /**
         * Authenticate with this secret (the servers' {@code --auth-file}):
         * every connection, and every reconnection, sends {@code U <secret>}
         * first and carries requests only once the server answered (within the
         * connect timeout). A server that refuses it makes calls fail with
         * {@link RefusedException} (reason {@code bad-auth}).
         *
         * @param secret 16 to 128 bytes of printable ASCII without spaces
         * @return this builder
         */
        public Builder auth(String secret) {
            this.secret = secret == null ? null : secret.trim();
            return this;
        }

        /**
         * Speak TLS to every server, with this context's trust (and key, for
         * mTLS) material. The server's certificate must name the host part of
         * its address (a DNS name, or an IP address SAN). {@link BatonTls}
         * builds a context from PEM files.
         *
         * @param context the TLS context
         * @return this builder
         */
        public Builder tls(SSLContext context) {
            this.tls = context;
            return this;
        }

        /**
         * How long one connection attempt may take (default 2 s).
         *
         * @param timeout above 0
         * @return this builder
         */
        public Builder connectTimeout(Duration timeout) {
            this.connectTimeout = timeout;
            return this;
        }

        /**
         * How long a server has to answer a request that does not wait in
         * line (default 5 s); a connection that leaves a request unanswered
         * that long is closed and reconnected.
         *
         * @param timeout above 0
         * @return this builder
         */
        public Builder requestTimeout(Duration timeout) {
            this.requestTimeout = timeout;
            return this;
        }

        /**
         * Where futures of the {@code *Async} calls complete, and where
         * {@link HeldGrant#onLost} callbacks and watch listeners run (default
         * {@link ForkJoinPool#commonPool()}). The client never runs user code
         * on its own threads.
         *
         * @param executor the executor
         * @return this builder
         */
        public Builder executor(Executor executor) {
            this.executor = Objects.requireNonNull(executor);
            return this;
        }

        /**
         * Start the client. It does not wait for the connections: they are
         * made in the background, and the first call waits for one (bounded by
         * its deadline). Never fails because no server is reachable.
         *
         * @return the client
         * @throws BatonArgumentException for a malformed address, secret or timeout
         */
        public BatonClient build() {
            List<String> parsed = Wire.parseServers(servers);
            if (secret != null) {
                Wire.checkSecret(secret);
            }
            for (Duration d : List.of(connectTimeout, requestTimeout)) {
                if (d == null || d.isZero() || d.isNegative() || d.toMillis() > Integer.MAX_VALUE) {
                    throw new BatonArgumentException("a timeout must be above 0 (and below 24 days), got " + d);
                }
            }
            return new BatonClient(this, parsed);
        }
    }

    // ---- helpers ----

    boolean isClosed() {
        return closed;
    }

    private void checkOpen() {
        if (closed) {
            throw new ClosedException("the client is closed");
        }
    }

    void forget(Grant g) {
        if (g instanceof HeldGrant) {
            held.remove(g);
        }
    }

    void forget(Watch w) {
        watches.remove(w);
    }

    /** Wait for an internal future on the caller's thread, rethrowing its error with the caller's stack. */
    static <T> T await(CompletableFuture<T> f, boolean cancelOnInterrupt) throws InterruptedException {
        try {
            return f.get();
        } catch (InterruptedException e) {
            if (cancelOnInterrupt) {
                f.cancel(false);
            }
            throw e;
        } catch (ExecutionException | CancellationException e) {
            throw forCaller(Calls.error(e));
        }
    }

    static BatonException forCaller(BatonException e) {
        String m = e.getMessage();
        BatonException copy;
        if (e instanceof BatonTimeoutException) {
            copy = new BatonTimeoutException(m);
        } else if (e instanceof LostException) {
            copy = new LostException(m);
        } else if (e instanceof UnavailableException) {
            copy = new UnavailableException(m);
        } else if (e instanceof RefusedException) {
            copy = new RefusedException(((RefusedException) e).reason(), m);
        } else if (e instanceof ClosedException) {
            copy = new ClosedException(m);
        } else if (e instanceof BatonArgumentException) {
            copy = new BatonArgumentException(m);
        } else {
            return e;
        }
        copy.initCause(e);
        return copy;
    }

    /** The user's view of an internal future: completed on the executor; cancelling it cancels the call. */
    <T> CompletableFuture<T> toUser(CompletableFuture<T> internal, Consumer<T> unwanted) {
        CompletableFuture<T> user = new CompletableFuture<>();
        internal.whenComplete((v, e) -> pool.executor.execute(() -> {
            if (e != null) {
                user.completeExceptionally(Calls.error(e));
            } else if (!user.complete(v) && unwanted != null) {
                unwanted.accept(v);
            }
        }));
        user.whenComplete((v, e) -> {
            if (user.isCancelled()) {
                internal.cancel(false);
            }
        });
        return user;
    }

    private static <T> CompletableFuture<T> failed(BatonException e) {
        return CompletableFuture.failedFuture(e);
    }

    // ---- acquire ----

    /**
     * Acquire {@code key} for {@code lease}, waiting in line without limit.
     *
     * @param key 1 to 250 bytes of UTF-8, no spaces or control characters
     * @param lease how long the grant lasts unless released or kept
     * @return the grant
     * @throws RefusedException when the server refuses (e.g. {@code lease-too-long})
     * @throws UnavailableException when no connection could carry the request
     * @throws ClosedException when the client is closed
     * @throws InterruptedException when interrupted while waiting (the request is given up)
     */
    public Grant acquire(String key, Duration lease) throws InterruptedException {
        return acquire(key, lease, null, AcquireOptions.none());
    }

    /**
     * Acquire {@code key} for {@code lease}, waiting in line at most {@code wait}.
     *
     * @param key 1 to 250 bytes of UTF-8, no spaces or control characters
     * @param lease how long the grant lasts unless released or kept
     * @param wait the longest wait in line; {@link Duration#ZERO}: only if the
     *     key can be granted now; null: without limit
     * @return the grant
     * @throws BatonTimeoutException when the wait ran out (nothing is held)
     * @throws RefusedException when the server refuses
     * @throws UnavailableException when no connection could carry the request
     * @throws ClosedException when the client is closed
     * @throws InterruptedException when interrupted while waiting (the request is given up)
     */
    public Grant acquire(String key, Duration lease, Duration wait) throws InterruptedException {
        return acquire(key, lease, wait, AcquireOptions.none());
    }

    /**
     * Acquire with a limit (a semaphore: up to that many grants at once, each
     * in its own {@link Grant#slot()}) and a value (who holds it: watchers see it).
     *
     * @param key 1 to 250 bytes of UTF-8, no spaces or control characters
     * @param lease how long the grant lasts unless released or kept
     * @param wait the longest wait in line; {@link Duration#ZERO}: only if
     *     free now; null: without limit
     * @param options the limit and value
     * @return the grant
     * @throws BatonTimeoutException when the wait ran out (nothing is held)
     * @throws RefusedException when the server refuses (e.g. {@code limit-mismatch})
     * @throws UnavailableException when no connection could carry the request
     * @throws ClosedException when the client is closed
     * @throws InterruptedException when interrupted while waiting (the request is given up)
     */
    public Grant acquire(String key, Duration lease, Duration wait, AcquireOptions options)
        throws InterruptedException {
        Calls.Granted g = await(acquireInternal(key, lease, wait, options), true);
        return new Grant(this, g);
    }

    /**
     * Acquire only if the key can be granted now.
     *
     * @param key the key
     * @param lease the lease
     * @return the grant
     * @throws BatonTimeoutException when the key is taken
     * @throws InterruptedException when interrupted while waiting for the answer
     */
    public Grant tryAcquire(String key, Duration lease) throws InterruptedException {
        return acquire(key, lease, Duration.ZERO, AcquireOptions.none());
    }

    /**
     * {@link #acquire(String, Duration, Duration, AcquireOptions)} as a future.
     * Cancelling it gives the acquire up; a grant that still arrives is released at once.
     *
     * @param key the key
     * @param lease the lease
     * @param wait the longest wait in line (ZERO: only if free now; null: without limit)
     * @param options the limit and value
     * @return a future of the grant
     */
    public CompletableFuture<Grant> acquireAsync(String key, Duration lease, Duration wait, AcquireOptions options) {
        CompletableFuture<Calls.Granted> internal;
        try {
            internal = acquireInternal(key, lease, wait, options);
        } catch (BatonException e) {
            return failed(e);
        }
        CompletableFuture<Grant> grants = internal.thenApply(g -> new Grant(this, g));
        grants.whenComplete((v, e) -> {
            if (grants.isCancelled()) {
                internal.cancel(false);
            }
        });
        return toUser(grants, g -> Calls.release(pool, g.key(), g.token()));
    }

    /**
     * {@link #acquire(String, Duration, Duration)} as a future.
     *
     * @param key the key
     * @param lease the lease
     * @param wait the longest wait in line (ZERO: only if free now; null: without limit)
     * @return a future of the grant
     */
    public CompletableFuture<Grant> acquireAsync(String key, Duration lease, Duration wait) {
        return acquireAsync(key, lease, wait, AcquireOptions.none());
    }

    private CompletableFuture<Calls.Granted> acquireInternal(String key, Duration lease, Duration wait,
                                                             AcquireOptions options) {
        checkOpen();
        Wire.checkKey(key);
        long leaseMs = Wire.checkLease(lease);
        long waitMs = Wire.checkWait(wait);
        AcquireOptions o = options == null ? AcquireOptions.none() : options;
        return new Calls.Acquire(pool, key, leaseMs, waitMs, o.limit(), o.value()).start();
    }

    // ---- hold, campaign ----

    /**
     * Acquire {@code key} (waiting without limit) and keep it alive in the
     * background until released; see {@link HeldGrant}.
     *
     * @param key the key
     * @param lease the lease, renewed every third of it
     * @return the held grant
     * @throws InterruptedException when interrupted while waiting
     */
    public HeldGrant hold(String key, Duration lease) throws InterruptedException {
        return hold(key, lease, null, AcquireOptions.none(), null);
    }

    /**
     * Acquire and keep alive in the background until released.
     *
     * @param key the key
     * @param lease the lease, renewed every third of it
     * @param wait the longest wait in line (ZERO: only if free now; null: without limit)
     * @param options the limit and value
     * @param onLost run on the executor if the grant is lost (may be null);
     *     registered before the grant is returned, so no loss is missed
     * @return the held grant
     * @throws BatonTimeoutException when the wait ran out
     * @throws RefusedException when the server refuses
     * @throws UnavailableException when no connection could carry the request
     * @throws InterruptedException when interrupted while waiting
     */
    public HeldGrant hold(String key, Duration lease, Duration wait, AcquireOptions options,
                          Consumer<LostException> onLost) throws InterruptedException {
        CompletableFuture<HeldGrant> f = holdInternal(key, lease, wait, options, onLost);
        return await(f, true);
    }

    /**
     * {@link #hold(String, Duration, Duration, AcquireOptions, Consumer)} as a future.
     *
     * @param key the key
     * @param lease the lease
     * @param wait the longest wait (ZERO: only if free now; null: without limit)
     * @param options the limit and value
     * @param onLost run if the grant is lost (may be null)
     * @return a future of the held grant
     */
    public CompletableFuture<HeldGrant> holdAsync(String key, Duration lease, Duration wait, AcquireOptions options,
                                                  Consumer<LostException> onLost) {
        try {
            return toUser(holdInternal(key, lease, wait, options, onLost), h -> h.releaseInternal());
        } catch (BatonException e) {
            return failed(e);
        }
    }

    private CompletableFuture<HeldGrant> holdInternal(String key, Duration lease, Duration wait,
                                                      AcquireOptions options, Consumer<LostException> onLost) {
        CompletableFuture<Calls.Granted> internal = acquireInternal(key, lease, wait, options);
        CompletableFuture<HeldGrant> result = new CompletableFuture<>();
        internal.whenComplete((g, e) -> {
            if (e != null) {
                result.completeExceptionally(Calls.error(e));
                return;
            }
            HeldGrant h = new HeldGrant(this, g);
            if (onLost != null) {
                h.onLost(onLost);
            }
            held.add(h);
            h.start();
            if (closed) {
                // Close began meanwhile and may not have seen this grant,
                // still in hand here (close waits for its release).
                h.stop();
                held.remove(h);
                pool.addHand();
                Calls.releaseInHand(pool, g.key, g.token);
                result.completeExceptionally(new ClosedException("the client is closed"));
            } else if (!result.complete(h)) {
                pool.addHand();
                h.releaseInternal().whenComplete((v, failure) -> pool.handOut());
            }
        });
        result.whenComplete((v, e) -> {
            if (result.isCancelled()) {
                internal.cancel(false);
            }
        });
        return result;
    }

    /**
     * Run for leader of the election on {@code key}: acquire it with limit 1
     * and this candidate's {@code value} (waiting in line without limit), and
     * keep it alive in the background. Whoever holds the key leads; watchers
     * ({@link #observe}) see the leader's value and a greater token for each
     * new leader. Fence the leader's work with its token.
     *
     * @param key the election's key
     * @param value this candidate's value (its address, say)
     * @param lease the lease, renewed every third of it
     * @return leadership, held until resigned ({@link HeldGrant#resign()}) or lost
     * @throws InterruptedException when interrupted while waiting
     */
    public HeldGrant campaign(String key, String value, Duration lease) throws InterruptedException {
        return campaign(key, value, lease, null, null);
    }

    /**
     * Run for leader, waiting in line at most {@code wait}.
     *
     * @param key the election's key
     * @param value this candidate's value
     * @param lease the lease
     * @param wait the longest wait (ZERO: only if nobody leads; null: without limit)
     * @param onLost run if leadership is lost (may be null)
     * @return leadership
     * @throws BatonTimeoutException when the wait ran out
     * @throws InterruptedException when interrupted while waiting
     */
    public HeldGrant campaign(String key, String value, Duration lease, Duration wait,
                              Consumer<LostException> onLost) throws InterruptedException {
        return hold(key, lease, wait, campaignOptions(value), onLost);
    }

    /**
     * {@link #campaign(String, String, Duration, Duration, Consumer)} as a future.
     *
     * @param key the election's key
     * @param value this candidate's value
     * @param lease the lease
     * @param wait the longest wait (ZERO: only if nobody leads; null: without limit)
     * @param onLost run if leadership is lost (may be null)
     * @return a future of leadership
     */
    public CompletableFuture<HeldGrant> campaignAsync(String key, String value, Duration lease, Duration wait,
                                                      Consumer<LostException> onLost) {
        try {
            return holdAsync(key, lease, wait, campaignOptions(value), onLost);
        } catch (BatonException e) {
            return failed(e);
        }
    }

    private static AcquireOptions campaignOptions(String value) {
        if (value == null) {
            throw new BatonArgumentException("a candidate's value is required");
        }
        return AcquireOptions.none().limit(1).value(value);
    }

    // ---- release by token, query ----

    /**
     * Release the grant that {@code token} names (a token from elsewhere, say
     * another process), with the retries of {@link Grant#release()}.
     *
     * @param key the key
     * @param token the grant's token (unsigned)
     * @return true when released, false when the token no longer held the key
     * @throws UnavailableException when no server could be reached for 5 s
     * @throws InterruptedException when interrupted while waiting
     */
    public boolean releaseToken(String key, long token) throws InterruptedException {
        checkOpen();
        Wire.checkKey(key);
        if (token == 0) {
            throw new BatonArgumentException("a token is never 0");
        }
        return await(Calls.release(pool, key, token), false);
    }

    /**
     * Who holds {@code key} and how many wait.
     *
     * @param key the key
     * @return the key's status
     * @throws UnavailableException when no server answered
     * @throws InterruptedException when interrupted while waiting
     */
    public KeyStatus query(String key) throws InterruptedException {
        checkOpen();
        Wire.checkKey(key);
        return await(Calls.query(pool, key), true);
    }

    /**
     * {@link #query(String)} as a future.
     *
     * @param key the key
     * @return a future of the key's status
     */
    public CompletableFuture<KeyStatus> queryAsync(String key) {
        try {
            checkOpen();
            Wire.checkKey(key);
            return toUser(Calls.query(pool, key), null);
        } catch (BatonException e) {
            return failed(e);
        }
    }

    // ---- watch, leader, observe ----

    /**
     * Watch {@code key}'s holders: {@code listener} gets the state now, then
     * one after each change, surviving failover, until the watch is closed.
     *
     * @param key the key
     * @param listener receives the states, in order, on the executor
     * @return the watch, to close
     */
    public Watch watch(String key, WatchListener listener) {
        return startWatch(key, listener, false);
    }

    /**
     * The leaders of the election on {@code key} as they change: a watch that
     * delivers the state now, then a state only when the leader changes (a
     * new token, or 0 when nobody leads).
     *
     * @param key the election's key
     * @param listener receives each leader, in order, on the executor
     * @return the watch, to close
     */
    public Watch observe(String key, WatchListener listener) {
        return startWatch(key, listener, true);
    }

    private Watch startWatch(String key, WatchListener listener, boolean leadersOnly) {
        checkOpen();
        Wire.checkKey(key);
        Objects.requireNonNull(listener, "listener");
        Watch w = new Watch(this, key, listener, leadersOnly);
        watches.add(w);
        if (closed) {
            watches.remove(w);
            throw new ClosedException("the client is closed");
        }
        w.start();
        return w;
    }

    /**
     * {@code key}'s states as a {@link Flow.Publisher}: each subscriber gets
     * a watch of its own (closed when it cancels), with at most 1024 states
     * buffered beyond its demand (the oldest dropped first).
     *
     * @param key the key
     * @return a publisher of the key's states
     */
    public Flow.Publisher<WatchState> watchPublisher(String key) {
        checkOpen();
        Wire.checkKey(key);
        return new WatchPublisher(this, key);
    }

    /**
     * Who leads the election on {@code key} now: its state ({@code token} 0
     * when nobody leads), from one {@code W}, then {@code X}.
     *
     * @param key the election's key
     * @return the state now
     * @throws UnavailableException when no state came within the connect plus request timeouts
     * @throws InterruptedException when interrupted while waiting
     */
    public WatchState leader(String key) throws InterruptedException {
        return await(leaderInternal(key), true);
    }

    /**
     * {@link #leader(String)} as a future.
     *
     * @param key the election's key
     * @return a future of the state now
     */
    public CompletableFuture<WatchState> leaderAsync(String key) {
        try {
            return toUser(leaderInternal(key), null);
        } catch (BatonException e) {
            return failed(e);
        }
    }

    private CompletableFuture<WatchState> leaderInternal(String key) {
        CompletableFuture<WatchState> f = new CompletableFuture<>();
        Watch w = startWatch(key, new WatchListener() {
            @Override
            public void onState(WatchState state) {
                f.complete(state);
            }

            @Override
            public void onError(BatonException error) {
                f.completeExceptionally(error);
            }
        }, false);
        long budget = pool.connectTimeoutMs + pool.requestTimeoutMs;
        ScheduledFuture<?> timer = pool.schedule(() -> f.completeExceptionally(new UnavailableException(
            "no state of " + key + " within " + budget + " ms: " + pool.describe())), Calls.ms(budget));
        f.whenComplete((s, e) -> {
            if (timer != null) {
                timer.cancel(false);
            }
            w.close();
        });
        return f;
    }

    // ---- the rest ----

    /**
     * The servers this client knows (those given, normalised, then those
     * learned from redirects).
     *
     * @return the servers' addresses
     */
    public List<String> servers() {
        return pool.servers();
    }

    /**
     * Close the client: watches end, held grants stop being kept and are
     * released (once, best effort, waiting up to a second for the answers; no
     * lost event), calls under way fail with {@link ClosedException}, a grant
     * that comes to a call close ended (the key a held grant's release hands
     * to this client's own waiter, say) is released before the connections
     * close (two {@code I} round trips on each connection with an acquire
     * outstanding, within the request timeout), as is a grant an acquire had
     * already been given but not yet returned (one it was confirming with a
     * keep: close waits for that call, at most the request timeout, and the
     * call fails with {@link ClosedException}), every connection closes and
     * every thread the client started ends. Every later call on the client or
     * its grants fails with {@link ClosedException}. Idempotent.
     */
    @Override
    public void close() {
        synchronized (this) {
            if (closed) {
                return;
            }
            closed = true;
        }
        // From now on a grant goes to no caller: it is released at once.
        pool.beginClose();
        for (Watch w : new ArrayList<>(watches)) {
            w.close();
        }
        List<CompletableFuture<Boolean>> releases = new ArrayList<>();
        for (HeldGrant h : new ArrayList<>(held)) {
            h.stop();
            releases.add(releaseOnce(h));
        }
        held.clear();
        if (!releases.isEmpty()) {
            try {
                CompletableFuture.allOf(releases.toArray(new CompletableFuture<?>[0]))
                    .get(1, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            } catch (ExecutionException | java.util.concurrent.TimeoutException e) {
                // best effort
            }
        }
        // The calls with a grant in hand (confirming it with K, say) see
        // that the client is closing and release it themselves, on
        // connections still open.
        pool.awaitHandsFree();
        // Take in (and release) the grants those releases, or anything
        // else, made to this client's own acquires; then close.
        pool.settle();
        pool.close(1500);
    }

    /** One attempt at releasing a held grant, on a connection up now. */
    private CompletableFuture<Boolean> releaseOnce(HeldGrant h) {
        long due = System.nanoTime() + Calls.ms(1000);
        return Calls.exchange(pool, due, () -> Wire.release(h.key(), h.token()))
            .handle((d, e) -> e == null && d.answer().tag == 'R');
    }

    @Override
    public String toString() {
        return "BatonClient" + pool.servers() + (closed ? " (closed)" : "");
    }
}
