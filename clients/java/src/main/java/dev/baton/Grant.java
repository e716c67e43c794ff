package dev.baton;

import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

/**
 * A key granted to this client: its fencing {@linkplain #token() token}, its
 * {@linkplain #key() key}, its {@linkplain #slot() slot} and when its lease
 * runs out by the client's own clock (counted from when the acquire was sent,
 * so it errs early).
 *
 * <p><b>Tokens are unsigned 64-bit integers.</b> Java has no unsigned
 * {@code long}: a token above {@link Long#MAX_VALUE} reads as a negative
 * {@code long}. Compare tokens with {@link Long#compareUnsigned(long, long)}
 * and print or store them with {@link Long#toUnsignedString(long)} (or
 * {@link #tokenString()}); never with {@code <} or {@link String#valueOf(long)}.
 *
 * <p>A grant is not bound to a thread: any thread may release or keep it.
 * {@link #close()} releases it, so a try-with-resources block holds a key
 * around a job:
 *
 * <pre>{@code
 * try (Grant grant = client.acquire("nightly-report", Duration.ofSeconds(30), Duration.ofSeconds(10))) {
 *     writeReport(grant.tokenString()); // the store refuses tokens not above the last it accepted
 * }
 * }</pre>
 */
public class Grant implements AutoCloseable {
    enum State { ACTIVE, RELEASING, RELEASED, LOST }

    final BatonClient client;
    private final String key;
    private final long token;
    private final int slot;
    final Object lock = new Object();
    // Under lock:
    long leaseMs;
    long leaseStart;
    State state = State.ACTIVE;

    Grant(BatonClient client, Calls.Granted g) {
        this.client = client;
        this.key = g.key;
        this.token = g.token;
        this.slot = g.slot;
        this.leaseMs = g.leaseMs;
        this.leaseStart = g.leaseStart;
    }

    /**
     * The key this grant holds.
     *
     * @return the key
     */
    public String key() {
        return key;
    }

    /**
     * The fencing token: an unsigned 64-bit integer, greater than every token
     * issued before it. Above {@link Long#MAX_VALUE} it reads as a negative
     * {@code long}; use {@link Long#toUnsignedString(long)} and
     * {@link Long#compareUnsigned(long, long)}.
     *
     * @return the token, unsigned
     */
    public long token() {
        return token;
    }

    /**
     * The token as an unsigned decimal, as the server wrote it.
     *
     * @return the token's decimal text
     */
    public String tokenString() {
        return Long.toUnsignedString(token);
    }

    /**
     * The slot of a semaphore this grant took: the lowest of 0 to limit-1 that
     * no other live grant held; 0 for a plain lock. Fence per (key, slot).
     *
     * @return the slot
     */
    public int slot() {
        return slot;
    }

    /**
     * The lease this grant was last given (by the acquire or a keep).
     *
     * @return the lease
     */
    public Duration lease() {
        synchronized (lock) {
            return Duration.ofMillis(leaseMs);
        }
    }

    /**
     * The time left on the lease by the client's clock (zero once it ran out).
     *
     * @return the time left
     */
    public Duration timeLeft() {
        synchronized (lock) {
            long left = Calls.deadline(leaseStart, TimeUnit.MILLISECONDS.toNanos(leaseMs)) - System.nanoTime();
            return left <= 0 ? Duration.ZERO : Duration.ofNanos(left);
        }
    }

    long expiresAtNanos() {
        synchronized (lock) {
            return Calls.deadline(leaseStart, TimeUnit.MILLISECONDS.toNanos(leaseMs));
        }
    }

    boolean isExpired() {
        return System.nanoTime() - expiresAtNanos() >= 0;
    }

    /**
     * Release the key (the next in line gets it at once). Retried for 5 s at
     * 200 ms intervals while no connection can carry it; an answer "not held"
     * after an attempt that may have got through counts as released.
     *
     * @throws LostException when the grant no longer held the key (its lease
     *     ran out and it went on), or a held grant was lost before
     * @throws ClosedException when the grant was already released, or its
     *     client closed
     * @throws UnavailableException when no server could be reached for 5 s
     * @throws InterruptedException when the thread is interrupted while
     *     waiting (the release goes on in the background)
     */
    public void release() throws InterruptedException {
        BatonClient.await(releaseInternal(), false);
    }

    /**
     * {@link #release()} as a future, completed on the client's executor.
     * Cancelling it does not stop the release.
     *
     * @return a future that completes when the key is released
     */
    public CompletableFuture<Void> releaseAsync() {
        return client.toUser(releaseInternal(), null);
    }

    /** What a release must stop first (a held grant's keep-alive). */
    void beforeRelease() {}

    CompletableFuture<Void> releaseInternal() {
        synchronized (lock) {
            if (client.isClosed()) {
                return CompletableFuture.failedFuture(new ClosedException("the client is closed"));
            }
            switch (state) {
                case RELEASING:
                case RELEASED:
                    return CompletableFuture.failedFuture(
                        new ClosedException(key + " (token " + tokenString() + ") was already released"));
                case LOST:
                    return CompletableFuture.failedFuture(lostError());
                default:
                    state = State.RELEASING;
            }
        }
        beforeRelease();
        return Calls.release(client.pool, key, token).<Void>handle((released, err) -> {
            synchronized (lock) {
                if (err != null) {
                    if (state == State.RELEASING) {
                        state = State.ACTIVE;
                    }
                    throw Calls.error(err);
                }
                if (released) {
                    state = State.RELEASED;
                    return null;
                }
                state = State.LOST;
            }
            client.forget(this);
            throw new LostException("lost " + key + " (token " + tokenString()
                + "): it was no longer held when released (its lease ran out)");
        }).whenComplete((v, e) -> client.forget(this));
    }

    LostException lostError() {
        return new LostException("lost " + key + " (token " + tokenString() + ")");
    }

    /**
     * Extend the lease to now + {@code lease}; the token stays the same.
     *
     * @param lease the new lease, above 0
     * @throws LostException when the server no longer holds the grant, or the
     *     lease ran out by the client's clock before a server answered
     * @throws ClosedException when the grant was released or its client closed
     * @throws UnavailableException when no server answered
     * @throws InterruptedException when the thread is interrupted while waiting
     */
    public void keep(Duration lease) throws InterruptedException {
        BatonClient.await(keepInternal(lease), true);
    }

    /**
     * {@link #keep(Duration)} as a future, completed on the client's executor.
     *
     * @param lease the new lease, above 0
     * @return a future that completes when the lease is extended
     */
    public CompletableFuture<Void> keepAsync(Duration lease) {
        try {
            return client.toUser(keepInternal(lease), null);
        } catch (BatonException e) {
            return CompletableFuture.failedFuture(e);
        }
    }

    CompletableFuture<Void> keepInternal(Duration lease) {
        long ms = Wire.checkLease(lease);
        synchronized (lock) {
            if (client.isClosed()) {
                return CompletableFuture.failedFuture(new ClosedException("the client is closed"));
            }
            if (state == State.RELEASED || state == State.RELEASING) {
                return CompletableFuture.failedFuture(
                    new ClosedException(key + " (token " + tokenString() + ") was released"));
            }
            if (state == State.LOST) {
                return CompletableFuture.failedFuture(lostError());
            }
        }
        if (isExpired()) {
            return CompletableFuture.failedFuture(markLost(new LostException(
                "lost " + key + " (token " + tokenString() + "): the lease ran out")));
        }
        return Calls.keep(client.pool, key, token, ms, expiresAtNanos()).<Void>handle((sentAt, err) -> {
            if (err == null) {
                renew(ms, sentAt);
                return null;
            }
            BatonException e = Calls.error(err);
            if (e instanceof UnavailableException && isExpired()) {
                e = new LostException("lost " + key + " (token " + tokenString()
                    + "): the lease ran out before a server answered");
            }
            if (e instanceof LostException) {
                throw markLost((LostException) e);
            }
            throw e;
        });
    }

    void renew(long ms, long sentAt) {
        synchronized (lock) {
            leaseMs = ms;
            leaseStart = sentAt;
        }
    }

    /** The grant is lost: every later call fails so. */
    LostException markLost(LostException e) {
        synchronized (lock) {
            if (state == State.ACTIVE) {
                state = State.LOST;
            }
        }
        return e;
    }

    /**
     * Release the key unless it was released already (then nothing happens),
     * so that try-with-resources lets go of it. Interrupted while waiting, it
     * lets the release finish in the background and keeps the thread's
     * interrupt flag set.
     *
     * @throws LostException when the grant was lost before it was released:
     *     work done under it may have overlapped another holder's
     * @throws UnavailableException when no server could be reached for 5 s
     */
    @Override
    public void close() {
        synchronized (lock) {
            if (state == State.RELEASED || state == State.RELEASING || client.isClosed()) {
                return;
            }
        }
        try {
            release();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        } catch (ClosedException e) {
            // released meanwhile, or the client closed: nothing to do
        }
    }

    @Override
    public String toString() {
        return getClass().getSimpleName() + "{key=" + key + ", token=" + tokenString() + ", slot=" + slot + "}";
    }
}
