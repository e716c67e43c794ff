package dev.baton;

import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.ScheduledFuture;
import java.util.function.Consumer;

/**
 * A grant kept alive in the background until released: the client's one
 * scheduler thread renews its lease ({@code K}) every third of the lease
 * and, while no server answers, retries every 200 ms until the lease runs out
 * by the client's clock. No thread per held lock.
 *
 * <p>Losing it is never only a log line: when a keep is answered "not held",
 * or the lease runs out before a keep gets through, the grant is lost at
 * once: {@link #lost()} completes, every {@link #onLost} callback runs (on the
 * client's executor), and every later call on it fails with
 * {@link LostException}. It is never acquired again silently.
 *
 * <pre>{@code
 * try (HeldGrant held = client.hold("reindex", Duration.ofSeconds(10))) {
 *     held.onLost(e -> stopWork());
 *     while (!held.isLost() && moreWork()) {
 *         step(held.tokenString());
 *     }
 * } // released
 * }</pre>
 */
public final class HeldGrant extends Grant {
    static final long KEEP_RETRY_MS = 200;

    private final CompletableFuture<LostException> lost = new CompletableFuture<>();
    private final List<Once> listeners = new CopyOnWriteArrayList<>();

    /** A callback that runs at most once. */
    private record Once(Consumer<LostException> callback, java.util.concurrent.atomic.AtomicBoolean ran) {}
    // Under lock:
    private boolean stopped;
    private ScheduledFuture<?> next;

    HeldGrant(BatonClient client, Calls.Granted g) {
        super(client, g);
    }

    void start() {
        synchronized (lock) {
            schedule(Calls.deadline(leaseStart, Calls.ms(leaseMs)) / 3);
        }
    }

    private void schedule(long atNanos) {
        if (stopped) {
            return;
        }
        next = client.pool.schedule(this::keepNow, atNanos - System.nanoTime());
    }

    private void keepNow() {
        long ms;
        long due;
        synchronized (lock) {
            if (stopped) {
                return;
            }
            ms = leaseMs;
            due = Calls.deadline(leaseStart, Calls.ms(leaseMs));
        }
        if (System.nanoTime() - due >= 0) {
            lose(new LostException("lost " + key() + " (token " + tokenString()
                + "): the lease ran out before a keep got through"));
            return;
        }
        Calls.keep(client.pool, key(), token(), ms, due).whenComplete((sentAt, err) -> {
            synchronized (lock) {
                if (stopped) {
                    return;
                }
                if (err == null) {
                    leaseMs = ms;
                    leaseStart = sentAt;
                    schedule(sentAt + Calls.ms(ms) / 3);
                    return;
                }
            }
            BatonException e = Calls.error(err);
            if (e instanceof UnavailableException) {
                synchronized (lock) {
                    long expiry = Calls.deadline(leaseStart, Calls.ms(leaseMs));
                    if (System.nanoTime() - expiry < 0) {
                        schedule(Math.min(System.nanoTime() + Calls.ms(KEEP_RETRY_MS), expiry));
                        return;
                    }
                }
                e = new LostException("lost " + key() + " (token " + tokenString()
                    + "): the lease ran out before a keep got through (" + e.getMessage() + ")");
            } else if (e instanceof ClosedException) {
                return;
            } else if (!(e instanceof LostException)) {
                e = new LostException("lost " + key() + " (token " + tokenString() + "): " + e.getMessage());
            }
            lose((LostException) e);
        });
    }

    private void lose(LostException e) {
        synchronized (lock) {
            if (stopped) {
                return;
            }
            stopped = true;
            if (state == State.ACTIVE) {
                state = State.LOST;
            }
        }
        client.forget(this);
        if (lost.complete(e)) {
            for (Once l : listeners) {
                runListener(l, e);
            }
        }
    }

    private void runListener(Once l, LostException e) {
        if (!l.ran().compareAndSet(false, true)) {
            return;
        }
        client.pool.executor.execute(() -> {
            try {
                l.callback().accept(e);
            } catch (RuntimeException x) {
                System.err.println("baton: an onLost callback failed: " + x);
            }
        });
    }

    /** Stop keeping it alive (a release, or the client closing); no lost event follows. */
    void stop() {
        synchronized (lock) {
            stopped = true;
            if (next != null) {
                next.cancel(false);
            }
        }
    }

    @Override
    void beforeRelease() {
        stop();
    }

    @Override
    LostException markLost(LostException e) {
        lose(e);
        return e;
    }

    @Override
    LostException lostError() {
        LostException why = lost.getNow(null);
        return why != null ? new LostException(why.getMessage()) : super.lostError();
    }

    /**
     * Whether the grant was lost.
     *
     * @return true once it is lost
     */
    public boolean isLost() {
        return lost.isDone();
    }

    /**
     * A future that completes (normally, with the reason) the moment the
     * grant is lost; it never completes when the grant is released or its
     * client closed first. Each call returns a new dependent future:
     * completing or cancelling it does not affect the grant.
     *
     * @return a future of the reason the grant was lost
     */
    public CompletableFuture<LostException> lost() {
        return lost.copy();
    }

    /**
     * Run {@code callback} on the client's executor when the grant is lost
     * (at once if it was lost already). Callbacks run at most once each.
     *
     * @param callback what to do when the grant is lost
     * @return this grant
     */
    public HeldGrant onLost(Consumer<LostException> callback) {
        Once once = new Once(java.util.Objects.requireNonNull(callback),
            new java.util.concurrent.atomic.AtomicBoolean());
        listeners.add(once);
        LostException already = lost.getNow(null);
        if (already != null) {
            runListener(once, already);
        }
        return this;
    }

    /**
     * Give the key up: the same as {@link #release()}, named for elections
     * ({@link BatonClient#campaign}).
     *
     * @throws LostException when leadership was lost before
     * @throws ClosedException when already resigned, or the client closed
     * @throws UnavailableException when no server could be reached for 5 s
     * @throws InterruptedException when interrupted while waiting
     */
    public void resign() throws InterruptedException {
        release();
    }
}
