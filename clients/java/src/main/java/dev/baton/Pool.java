package dev.baton;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Executor;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import javax.net.ssl.SSLContext;

/**
 * The servers and connections a client keeps, the choice of a connection
 * for each request, the scheduler thread ("baton-scheduler": deadlines,
 * pauses between retries, keep-alives) and the signal of connection phase
 * changes that callers waiting for a connection wait on.
 * Choice ({@link #choose}, pure): the preferred node's connections first, if
 * one is up; else any connection that is up, round-robin. An acquire of key K
 * goes to a connection with no acquire of K outstanding, when one of those is
 * up: the server answers a later acquire of K on a connection (even its
 * {@code T}) only after the earlier one, so a try-acquire sent behind the same
 * client's acquire of K waiting in line would wait for that one. When every
 * one up has one and another is still connecting (a new client's second), the
 * acquire waits for that one (a connection change, within the bounds below);
 * when none is connecting, or that wait is over, it is sent anyway on a busy
 * one, and its overdue clock starts only when the earlier one is answered
 * (Calls). A caller waits only
 * while some connection it could use is connecting, bounded by its own
 * deadline and the connect timeout (+1 s), and fails at once when every one
 * is down. Never does: send, retry or interpret answers.
 */
final class Pool {
    static final int CONNECTIONS_FOR_ONE_SERVER = 2;
    static final int MAX_SERVERS = 64;
    static final long CONNECT_SLACK_MS = 1000;
    static final int WAIT = -1;
    static final int NOTHING = -2;
    static final long NONE = Long.MAX_VALUE;

    final long connectTimeoutMs;
    final long requestTimeoutMs;
    final String secret;
    final SSLContext tls;
    final Executor executor;
    private final ScheduledThreadPoolExecutor scheduler;

    private final Object nodesLock = new Object();
    private final List<String> addrs = new ArrayList<>();
    private volatile Conn[] conns = new Conn[0];
    private final AtomicInteger preferred = new AtomicInteger(-1);
    private final AtomicInteger turn = new AtomicInteger();

    private final Object notifyLock = new Object();
    private long version;
    private List<Runnable> waiters = new ArrayList<>();

    private final Object sleepLock = new Object();
    private volatile boolean closing;
    private volatile boolean closed;
    /**
     * Grants in hand: delivered to an acquire call that has not returned it
     * yet (confirming it with K, say), or being released because nobody
     * will get it. Close waits until none is left before it settles and
     * closes the connections.
     */
    private final AtomicInteger hands = new AtomicInteger();
    private final Object handsLock = new Object();

    Pool(List<String> servers, long connectTimeoutMs, long requestTimeoutMs, String secret, SSLContext tls,
         Executor executor) {
        this.connectTimeoutMs = connectTimeoutMs;
        this.requestTimeoutMs = requestTimeoutMs;
        this.secret = secret;
        this.tls = tls;
        this.executor = executor;
        this.scheduler = new ScheduledThreadPoolExecutor(1, r -> {
            Thread t = new Thread(r, "baton-scheduler");
            t.setDaemon(true);
            return t;
        });
        scheduler.setRemoveOnCancelPolicy(true);
        scheduler.setExecuteExistingDelayedTasksAfterShutdownPolicy(false);
        int perNode = servers.size() == 1 ? CONNECTIONS_FOR_ONE_SERVER : 1;
        synchronized (nodesLock) {
            for (String addr : servers) {
                addNode(addr, perNode);
            }
        }
    }

    private int addNode(String addr, int count) {
        int index = addrs.size();
        addrs.add(addr);
        Conn[] now = conns;
        Conn[] next = java.util.Arrays.copyOf(now, now.length + count);
        for (int i = 0; i < count; i++) {
            Conn c = new Conn(this, index, addr);
            next[now.length + i] = c;
        }
        conns = next;
        for (int i = 0; i < count; i++) {
            next[now.length + i].start();
        }
        bump();
        return index;
    }

    boolean isClosed() {
        return closed;
    }

    /** The client is closing (or closed): a grant goes to no caller, an acquire is not sent (again). */
    boolean isClosing() {
        return closing;
    }

    /** The client begins to close: see {@link #isClosing}. Its held keys' releases still go out. */
    void beginClose() {
        closing = true;
    }

    /**
     * A grant is about to be delivered to its acquire call: counted in hand,
     * unless the client is closing (false: it goes to nobody). The count
     * comes first, so close, which marks the client closing before it waits
     * for the count, either waits for this grant or is seen here.
     */
    boolean takeInHand() {
        hands.incrementAndGet();
        if (closing) {
            handOut();
            return false;
        }
        return true;
    }

    /** One more grant in hand (one already in hand is to be released). */
    void addHand() {
        hands.incrementAndGet();
    }

    /** A grant in hand was returned to its caller or released. */
    void handOut() {
        if (hands.decrementAndGet() == 0) {
            synchronized (handsLock) {
                handsLock.notifyAll();
            }
        }
    }

    /** The client is closing: wait until no grant is in hand, for at most the request timeout. */
    void awaitHandsFree() {
        long until = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(requestTimeoutMs);
        synchronized (handsLock) {
            while (hands.get() > 0) {
                long left = until - System.nanoTime();
                if (left <= 0) {
                    return;
                }
                try {
                    TimeUnit.NANOSECONDS.timedWait(handsLock, left);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    return;
                }
            }
        }
    }

    /**
     * The client is closing: every connection with an acquire (or a
     * release) outstanding takes in, and releases, the grants already made
     * to it, for at most the request timeout in all (see {@link Conn#settle}).
     */
    void settle() {
        long until = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(requestTimeoutMs);
        try {
            for (Conn c : conns) {
                c.settle(until);
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    Conn[] conns() {
        return conns;
    }

    List<String> servers() {
        synchronized (nodesLock) {
            return List.copyOf(addrs);
        }
    }

    ScheduledFuture<?> schedule(Runnable task, long delayNanos) {
        try {
            return scheduler.schedule(() -> {
                try {
                    task.run();
                } catch (RuntimeException e) {
                    System.err.println("baton: a scheduled task failed: " + e);
                }
            }, Math.max(0, delayNanos), TimeUnit.NANOSECONDS);
        } catch (java.util.concurrent.RejectedExecutionException e) {
            return null; // closed
        }
    }

    /** The node with this address, registered (with one connection) if it is new. */
    int nodeFor(String addr) {
        String normal;
        try {
            normal = Wire.normalise(addr);
        } catch (BatonArgumentException e) {
            throw new UnavailableException("redirected to '" + addr + "', which is not host:port");
        }
        synchronized (nodesLock) {
            int i = addrs.indexOf(normal);
            if (i >= 0) {
                return i;
            }
            if (addrs.size() >= MAX_SERVERS) {
                throw new UnavailableException("redirected to " + normal + ", but this client already knows "
                    + MAX_SERVERS + " servers");
            }
            if (closed) {
                throw new ClosedException("the client is closed");
            }
            return addNode(normal, 1);
        }
    }

    void prefer(int node) {
        preferred.set(node);
    }

    boolean isReachable(int node) {
        for (Conn c : conns) {
            if (c.node == node && c.phase() != Conn.Phase.DOWN) {
                return true;
            }
        }
        return false;
    }

    int connectionCount() {
        return conns.length;
    }

    /**
     * Pick among (node, phase) pairs: the preferred node's up connections
     * first; while the preferred node is connecting and none of it is up,
     * wait for it; else any up connection, round-robin by {@code turn}.
     *
     * @return the index to use, {@link #WAIT}, or {@link #NOTHING}
     */
    static int choose(int[] nodes, Conn.Phase[] phases, int preferred, int turn) {
        return choose(nodes, phases, null, preferred, turn);
    }

    /**
     * {@link #choose(int[], Conn.Phase[], int, int)}, the up connections not
     * {@code busy} (an acquire of the same key outstanding there; null: none
     * is) first among those of a node; when every one up is busy and another
     * is connecting, {@link #WAIT} for it.
     */
    static int choose(int[] nodes, Conn.Phase[] phases, boolean[] busy, int preferred, int turn) {
        return choose(nodes, phases, busy, false, preferred, turn);
    }

    /**
     * {@link #choose(int[], Conn.Phase[], boolean[], int, int)}; {@code settle}:
     * the wait for a connection is over, so a busy one serves rather than
     * waiting longer for one connecting.
     */
    static int choose(int[] nodes, Conn.Phase[] phases, boolean[] busy, boolean settle, int preferred, int turn) {
        if (preferred >= 0) {
            int c = among(nodes, phases, busy, settle, preferred, turn);
            if (c != NOTHING) {
                return c;
            }
        }
        return among(nodes, phases, busy, settle, -1, turn);
    }

    private static int among(int[] nodes, Conn.Phase[] phases, boolean[] busy, boolean settle, int node, int turn) {
        if (busy != null) {
            int c = among(nodes, phases, busy, node, turn, true);
            // WAIT here: every one up is busy with this key and another is
            // connecting (a new client's second, say): it will be free, so
            // wait for it rather than queue behind this client's own waiter.
            if (c >= 0 || (c == WAIT && !settle)) {
                return c;
            }
        }
        return among(nodes, phases, busy, node, turn, false);
    }

    private static int among(int[] nodes, Conn.Phase[] phases, boolean[] busy, int node, int turn, boolean free) {
        int up = 0;
        boolean connecting = false;
        for (int i = 0; i < nodes.length; i++) {
            if (node < 0 || nodes[i] == node) {
                if (phases[i] == Conn.Phase.UP && !(free && busy[i])) {
                    up++;
                } else if (phases[i] == Conn.Phase.CONNECTING) {
                    connecting = true;
                }
            }
        }
        if (up > 0) {
            int want = Math.floorMod(turn, up);
            for (int i = 0; i < nodes.length; i++) {
                if ((node < 0 || nodes[i] == node) && phases[i] == Conn.Phase.UP && !(free && busy[i])
                    && want-- == 0) {
                    return i;
                }
            }
        }
        return connecting ? WAIT : NOTHING;
    }

    /** A connection up now; null while one is connecting; throws when none can be had. */
    Conn chooseNow() {
        return chooseNow(null);
    }

    /**
     * A connection up now, for an acquire of {@code acquireKey} (null: not an
     * acquire) one with no acquire of it outstanding if it can; null while
     * one is connecting (also while every one up is busy with that key and
     * another is connecting, unless {@code settle}); throws when none can be had.
     */
    Conn chooseNow(String acquireKey) {
        return chooseNow(acquireKey, false);
    }

    private Conn chooseNow(String acquireKey, boolean settle) {
        if (closed) {
            throw new ClosedException("the client is closed");
        }
        Conn[] all = conns;
        int[] nodes = new int[all.length];
        Conn.Phase[] phases = new Conn.Phase[all.length];
        boolean[] busy = acquireKey == null ? null : new boolean[all.length];
        for (int i = 0; i < all.length; i++) {
            nodes[i] = all[i].node;
            phases[i] = all[i].phase();
            if (busy != null) {
                busy[i] = all[i].hasPending('A', acquireKey);
            }
        }
        int c = choose(nodes, phases, busy, settle, preferred.get(), turn.getAndIncrement());
        if (c >= 0) {
            return all[c];
        }
        if (c == WAIT) {
            return null;
        }
        throw noConnection("no connection: ");
    }

    BatonException noConnection(String prefix) {
        String refused = authRefused();
        if (refused != null) {
            return new RefusedException(refused, "the server refused the secret: " + refused + " (" + describe() + ")");
        }
        return new UnavailableException(prefix + describe());
    }

    /** The reason word when a server refused this client's secret. */
    String authRefused() {
        for (Conn c : conns) {
            String r = c.authRefused();
            if (r != null) {
                return r;
            }
        }
        return null;
    }

    /** "a:1 (connection refused); b:2 (not connected yet)". */
    String describe() {
        StringBuilder b = new StringBuilder();
        List<String> names = servers();
        for (int n = 0; n < names.size(); n++) {
            String why = null;
            for (Conn c : conns) {
                if (c.node == n && why == null) {
                    why = c.lastError();
                }
            }
            if (b.length() > 0) {
                b.append("; ");
            }
            b.append(names.get(n)).append(" (").append(why == null ? "not connected yet" : why).append(')');
        }
        return b.toString();
    }

    /**
     * A connection that is up (see {@link #chooseNow(String)}), waiting until
     * {@code dueNanos} at most (and the connect timeout) while one is
     * connecting; when that wait ends with one up but busy with the key
     * (waited on for a free one still connecting), that one after all.
     */
    CompletableFuture<Conn> pick(long dueNanos, String acquireKey) {
        Conn c;
        long seen = version();
        try {
            c = chooseNow(acquireKey);
        } catch (BatonException e) {
            return CompletableFuture.failedFuture(e);
        }
        if (c != null) {
            return CompletableFuture.completedFuture(c);
        }
        long patience = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(connectTimeoutMs + CONNECT_SLACK_MS);
        long until = Math.min(dueNanos, patience);
        CompletableFuture<Conn> f = new CompletableFuture<>();
        ScheduledFuture<?> timer = schedule(() -> settle(f, acquireKey), until - System.nanoTime());
        f.whenComplete((x, e) -> {
            if (timer != null) {
                timer.cancel(false);
            }
        });
        retryPick(f, seen, acquireKey);
        return f;
    }

    /** The wait for a connection is over: a busy one that is up serves, else none came up. */
    private void settle(CompletableFuture<Conn> f, String acquireKey) {
        if (f.isDone()) {
            return;
        }
        Conn c;
        try {
            c = chooseNow(acquireKey, true);
        } catch (BatonException e) {
            f.completeExceptionally(e);
            return;
        }
        if (c != null) {
            f.complete(c);
        } else {
            f.completeExceptionally(noConnection("still connecting: "));
        }
    }

    private void retryPick(CompletableFuture<Conn> f, long seen, String acquireKey) {
        while (!f.isDone()) {
            Conn c;
            try {
                c = chooseNow(acquireKey);
            } catch (BatonException e) {
                f.completeExceptionally(e);
                return;
            }
            if (c != null) {
                f.complete(c);
                return;
            }
            final long now = seen;
            if (onChange(now, () -> retryPick(f, version(), acquireKey))) {
                return;
            }
            seen = version();
        }
    }

    long version() {
        synchronized (notifyLock) {
            return version;
        }
    }

    /** Run {@code task} at the next phase change after {@code seen}; false (and nothing registered) when one came already. */
    boolean onChange(long seen, Runnable task) {
        synchronized (notifyLock) {
            if (version != seen) {
                return false;
            }
            waiters.add(task);
            return true;
        }
    }

    /** A connection's phase changed: wake whoever waits for one. */
    void bump() {
        List<Runnable> run;
        synchronized (notifyLock) {
            version++;
            if (waiters.isEmpty()) {
                return;
            }
            run = waiters;
            waiters = new ArrayList<>();
        }
        for (Runnable r : run) {
            try {
                r.run();
            } catch (RuntimeException e) {
                System.err.println("baton: a waiter failed: " + e);
            }
        }
    }

    /** Sleep before reconnecting; true when the client closed meanwhile. */
    boolean sleepReconnect(long ms) {
        long end = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(ms);
        synchronized (sleepLock) {
            while (!closed) {
                long left = end - System.nanoTime();
                if (left <= 0) {
                    return false;
                }
                try {
                    TimeUnit.NANOSECONDS.timedWait(sleepLock, left);
                } catch (InterruptedException e) {
                    return true;
                }
            }
            return true;
        }
    }

    /** Stop every connection and the scheduler; wait (bounded) for their threads to end. */
    void close(long waitMs) {
        closing = true;
        closed = true;
        synchronized (sleepLock) {
            sleepLock.notifyAll();
        }
        for (Conn c : conns) {
            c.shut();
        }
        bump();
        scheduler.shutdownNow();
        long end = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(waitMs);
        Thread self = Thread.currentThread();
        for (Conn c : conns) {
            Thread t = c.thread();
            if (t != null && t != self) {
                try {
                    t.join(Math.max(1, TimeUnit.NANOSECONDS.toMillis(end - System.nanoTime())));
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    return;
                }
            }
        }
        try {
            scheduler.awaitTermination(Math.max(1, TimeUnit.NANOSECONDS.toMillis(end - System.nanoTime())),
                TimeUnit.MILLISECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
