package dev.baton;

import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.atomic.AtomicBoolean;

/**
 * A watch of one key's holders, made by {@link BatonClient#watch} or
 * {@link BatonClient#observe}: its listener gets the key's state now, then a
 * state after each change. It survives failover: when its connection ends
 * (or the node is shutting down) it watches again on another connection at
 * once, then after pauses growing from 100 ms to 1 s while no state comes;
 * it follows {@code M} to the active node; and the first state of every new
 * subscription is delivered. {@link #close()} ends it: no state is delivered
 * after close returns.
 */
public final class Watch implements AutoCloseable {
    static final long MAX_PAUSE_MS = 1000;

    /** What a connection tells a watch. */
    static final class Event {
        final char kind; // S state, M moved, E refused, D ended
        final Wire.Answer state;
        final String text;

        private Event(char kind, Wire.Answer state, String text) {
            this.kind = kind;
            this.state = state;
            this.text = text;
        }

        static Event state(Wire.Answer a) {
            return new Event('S', a, null);
        }

        static Event moved(String active) {
            return new Event('M', null, active);
        }

        static Event refused(String reason) {
            return new Event('E', null, reason);
        }

        static Event ended() {
            return new Event('D', null, null);
        }
    }

    private final BatonClient client;
    private final Pool pool;
    private final String key;
    private final WatchListener listener;
    private final boolean leadersOnly;
    // Under this:
    private long epoch;
    private Conn conn;
    private long generation;
    private boolean answered;
    private int failures;
    private int hops;
    private boolean hasLast;
    private long lastToken;
    private ScheduledFuture<?> timer;
    private volatile boolean closed;
    // Delivery, in order, on the executor:
    private final ConcurrentLinkedQueue<Runnable> outbox = new ConcurrentLinkedQueue<>();
    private final AtomicBoolean draining = new AtomicBoolean();
    private final Object deliverLock = new Object();

    Watch(BatonClient client, String key, WatchListener listener, boolean leadersOnly) {
        this.client = client;
        this.pool = client.pool;
        this.key = key;
        this.listener = listener;
        this.leadersOnly = leadersOnly;
    }

    /**
     * The key watched.
     *
     * @return the key
     */
    public String key() {
        return key;
    }

    /**
     * Whether the watch was closed (or ended for good).
     *
     * @return true once closed
     */
    public boolean isClosed() {
        return closed;
    }

    synchronized void start() {
        subscribe();
    }

    private void subscribe() {
        if (closed) {
            return;
        }
        cancelTimer();
        long seen = pool.version();
        Conn c;
        try {
            c = pool.chooseNow();
        } catch (ClosedException e) {
            return;
        } catch (RefusedException e) {
            end(e);
            return;
        } catch (BatonException e) {
            failedTry();
            return;
        }
        if (c == null) {
            if (!pool.onChange(seen, this::resubscribe)) {
                subscribe();
            }
            return;
        }
        epoch++;
        long gen = c.watch(key, this, epoch);
        if (gen < 0) {
            failedTry();
            return;
        }
        conn = c;
        generation = gen;
        answered = false;
        long mine = epoch;
        timer = pool.schedule(() -> firstLineOverdue(mine), Calls.ms(pool.requestTimeoutMs));
    }

    private synchronized void resubscribe() {
        if (conn == null) {
            subscribe();
        }
    }

    private synchronized void firstLineOverdue(long mine) {
        if (closed || mine != epoch || conn == null || answered) {
            return;
        }
        conn.kill(generation, "no answer to W " + key + " within " + pool.requestTimeoutMs + " ms");
        giveUpSubscription();
        failedTry();
    }

    private void giveUpSubscription() {
        if (conn != null) {
            conn.unwatch(key, generation, this, epoch);
            conn = null;
        }
        epoch++;
    }

    private void failedTry() {
        failures++;
        long pause = failures <= 1 ? 0
            : Math.min(Calls.NO_ACTIVE_RETRY_MS << Math.min(failures - 2, 8), MAX_PAUSE_MS);
        cancelTimer();
        if (pause == 0) {
            timer = pool.schedule(this::resubscribe, 0);
        } else {
            timer = pool.schedule(this::resubscribe, Calls.ms(pause));
        }
    }

    private void cancelTimer() {
        if (timer != null) {
            timer.cancel(false);
            timer = null;
        }
    }

    /** From a connection's thread. */
    synchronized void onEvent(long ep, Event ev) {
        if (closed || ep != epoch || conn == null) {
            return;
        }
        switch (ev.kind) {
            case 'S':
                answered = true;
                failures = 0;
                hops = 0;
                cancelTimer();
                Wire.Answer a = ev.state;
                if (leadersOnly && hasLast && lastToken == a.token) {
                    return;
                }
                hasLast = true;
                lastToken = a.token;
                WatchState s = new WatchState(a.key, a.token, a.holders, a.waiting, a.value);
                deliver(() -> listener.onState(s));
                return;
            case 'M':
                conn = null;
                epoch++;
                moved(ev.text);
                return;
            case 'E':
                conn = null;
                epoch++;
                if ("shutting-down".equals(ev.text)) {
                    failedTry();
                } else {
                    end(new RefusedException(ev.text, "watch of " + key + " refused by the server: " + ev.text));
                }
                return;
            default:
                conn = null;
                epoch++;
                failedTry();
        }
    }

    private void moved(String active) {
        if (active != null) {
            try {
                int node = pool.nodeFor(active);
                if (pool.isReachable(node) && hops < Calls.MAX_REDIRECTS) {
                    hops++;
                    pool.prefer(node);
                    subscribe();
                    return;
                }
            } catch (BatonException e) {
                // try again after a pause
            }
        }
        failedTry();
    }

    private void end(BatonException e) {
        if (closed) {
            return;
        }
        closed = true;
        cancelTimer();
        client.forget(this);
        deliverFinal(() -> listener.onError(e));
    }

    private void deliver(Runnable r) {
        outbox.add(() -> {
            synchronized (deliverLock) {
                if (!closed) {
                    r.run();
                }
            }
        });
        drain();
    }

    private void deliverFinal(Runnable r) {
        outbox.add(() -> {
            synchronized (deliverLock) {
                r.run();
            }
        });
        drain();
    }

    private void drain() {
        if (!draining.compareAndSet(false, true)) {
            return;
        }
        pool.executor.execute(() -> {
            while (true) {
                Runnable r;
                while ((r = outbox.poll()) != null) {
                    try {
                        r.run();
                    } catch (RuntimeException e) {
                        System.err.println("baton: a watch listener failed: " + e);
                    }
                }
                draining.set(false);
                if (outbox.isEmpty() || !draining.compareAndSet(false, true)) {
                    return;
                }
            }
        });
    }

    /**
     * Stop watching: {@code X} is sent when this was the key's last watch on
     * its connection, and no state is delivered after this returns (a
     * listener running now is waited for, unless close is called from it).
     */
    @Override
    public void close() {
        synchronized (this) {
            if (closed) {
                return;
            }
            closed = true;
            cancelTimer();
            if (conn != null) {
                conn.unwatch(key, generation, this, epoch);
                conn = null;
            }
        }
        client.forget(this);
        synchronized (deliverLock) {
            // waits out a listener call in progress
        }
    }
}
