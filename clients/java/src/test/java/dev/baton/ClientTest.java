package dev.baton;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Flow;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** The client against a real batond. */
@Timeout(60)
class ClientTest {
    private static Batond node;
    private static final Duration LEASE = Duration.ofSeconds(30);

    @BeforeAll
    static void start() throws Exception {
        node = Batond.start();
    }

    @AfterAll
    static void stop() throws Exception {
        node.close();
    }

    private static BatonClient client() {
        return BatonClient.connect(node.addr);
    }

    private static String key(String name) {
        return name + "-" + System.nanoTime();
    }

    @Test
    void acquireReleaseAndTryAcquire() throws Exception {
        try (BatonClient c = client()) {
            String k = key("job");
            Grant g = c.acquire(k, LEASE, Duration.ofSeconds(5));
            assertEquals(k, g.key());
            assertEquals(0, g.slot());
            assertTrue(Long.compareUnsigned(g.token(), 0) > 0);
            KeyStatus s = c.query(k);
            assertEquals(g.token(), s.token());
            assertThrows(BatonTimeoutException.class, () -> c.tryAcquire(k, LEASE));
            assertThrows(BatonTimeoutException.class, () -> c.acquire(k, LEASE, Duration.ofMillis(200)));
            g.release();
            assertTrue(c.query(k).isFree());
            try (Grant again = c.tryAcquire(k, LEASE)) {
                assertTrue(Long.compareUnsigned(again.token(), g.token()) > 0, "tokens grow");
            }
            assertTrue(c.query(k).isFree(), "try-with-resources released it");
        }
    }

    /** Poll until {@code n} acquires of {@code k} wait in line (bounded by the class's timeout). */
    private static void waiting(BatonClient c, String k, long n) throws Exception {
        while (c.query(k).waiting() != n) {
            Thread.sleep(5);
        }
    }

    @Test
    void aTryAcquireBehindTheClientsOwnWaiterTimesOutAndTheWaiterKeepsItsPlace() throws Exception {
        try (BatonClient c = client(); BatonClient other = client()) {
            String k = key("own");
            Grant holder = other.acquire(k, LEASE);
            CompletableFuture<Grant> first = c.acquireAsync(k, LEASE, null);
            waiting(other, k, 1);
            // Two in a row: round-robin alone would put one of them behind
            // the waiter, where the server holds its T back until the waiter
            // is answered (and the connection, deemed dead, would be closed).
            for (int i = 0; i < 2; i++) {
                assertThrows(BatonTimeoutException.class, () -> c.tryAcquire(k, LEASE));
            }
            CompletableFuture<Grant> second = other.acquireAsync(k, LEASE, null);
            waiting(other, k, 2);
            holder.release();
            Grant g1 = first.get(10, TimeUnit.SECONDS);
            assertTrue(Long.compareUnsigned(g1.token(), holder.token()) > 0);
            assertFalse(second.isDone(), "the first waiter kept its place");
            g1.release();
            Grant g2 = second.get(10, TimeUnit.SECONDS);
            assertTrue(Long.compareUnsigned(g2.token(), g1.token()) > 0);
            g2.release();
        }
    }

    @Test
    void aTryAcquireHeldBackOnEveryConnectionTimesOutWithoutClosingOne() throws Exception {
        // A short request timeout: the try-acquire's answer is due within it
        // (plus its wait), by which time the server still holds it back.
        try (BatonClient c = BatonClient.builder(node.addr).requestTimeout(Duration.ofMillis(300)).build();
             BatonClient other = client()) {
            String k = key("full");
            Grant holder = other.acquire(k, LEASE);
            // One waiter of c on each of its two connections, another
            // client's behind them.
            CompletableFuture<Grant> first = c.acquireAsync(k, LEASE, null);
            waiting(other, k, 1);
            CompletableFuture<Grant> second = c.acquireAsync(k, LEASE, null);
            waiting(other, k, 2);
            CompletableFuture<Grant> third = other.acquireAsync(k, LEASE, null);
            waiting(other, k, 3);
            assertThrows(BatonTimeoutException.class, () -> c.tryAcquire(k, LEASE));
            // Had a connection been closed, its waiter would have been sent
            // again, behind the third.
            holder.release();
            long last = holder.token();
            for (CompletableFuture<Grant> next : List.of(first, second, third)) {
                Grant g = next.get(10, TimeUnit.SECONDS);
                assertTrue(Long.compareUnsigned(g.token(), last) > 0);
                last = g.token();
                g.release();
            }
        }
    }

    @Test
    void theNextInLineGetsTheKeyOnRelease() throws Exception {
        try (BatonClient c = client()) {
            String k = key("line");
            Grant first = c.acquire(k, LEASE);
            CompletableFuture<Grant> second = c.acquireAsync(k, LEASE, null);
            Thread.sleep(100);
            assertFalse(second.isDone());
            assertEquals(1, c.query(k).waiting());
            first.release();
            Grant g = second.get(10, TimeUnit.SECONDS);
            assertTrue(Long.compareUnsigned(g.token(), first.token()) > 0);
            g.releaseAsync().get(10, TimeUnit.SECONDS);
        }
    }

    @Test
    void semaphoresGiveSlotsAndRefuseAnotherLimit() throws Exception {
        try (BatonClient c = client()) {
            String k = key("gpu");
            AcquireOptions two = AcquireOptions.none().limit(2).value("host-a");
            Grant a = c.acquire(k, LEASE, null, two);
            Grant b = c.acquire(k, LEASE, null, two);
            assertEquals(Set.of(0, 1), Set.of(a.slot(), b.slot()));
            assertThrows(BatonTimeoutException.class, () -> c.acquire(k, LEASE, Duration.ZERO, two));
            RefusedException e = assertThrows(RefusedException.class,
                () -> c.acquire(k, LEASE, Duration.ZERO, AcquireOptions.none().limit(3)));
            assertEquals("limit-mismatch", e.reason());
            int freed = a.slot();
            a.release();
            Grant c3 = c.acquire(k, LEASE, Duration.ofSeconds(1), two);
            assertEquals(freed, c3.slot());
            b.release();
            c3.release();
        }
    }

    @Test
    void theServersRefusalCarriesItsReason() throws Exception {
        try (BatonClient c = client()) {
            RefusedException e = assertThrows(RefusedException.class,
                () -> c.acquire(key("long"), Duration.ofDays(300)));
            assertTrue(e.reason().contains("lease"), e.reason());
            assertThrows(BatonArgumentException.class, () -> c.acquire("a b", LEASE));
        }
    }

    @Test
    void aHeldGrantOutlivesItsLeaseAndSaysAtOnceWhenLost() throws Exception {
        try (BatonClient c = client(); BatonClient other = client()) {
            String k = key("held");
            LinkedBlockingQueue<LostException> lost = new LinkedBlockingQueue<>();
            HeldGrant h = c.hold(k, Duration.ofMillis(600), null, AcquireOptions.none(), lost::add);
            Thread.sleep(1500); // more than two leases: kept alive
            assertEquals(h.token(), c.query(k).token());
            assertFalse(h.isLost());
            // Someone else releases it (a grant is not tied to a connection): the next keep is answered not-held.
            assertTrue(other.releaseToken(k, h.token()));
            LostException why = lost.poll(5, TimeUnit.SECONDS);
            assertTrue(why != null, "onLost ran");
            assertTrue(h.lost().isDone());
            assertTrue(h.isLost());
            assertThrows(LostException.class, h::release);
            assertThrows(LostException.class, () -> h.keep(LEASE));
        }
    }

    @Test
    void aHeldGrantReleasedFromAnotherThread() throws Exception {
        try (BatonClient c = client()) {
            String k = key("any-thread");
            HeldGrant h = c.hold(k, Duration.ofSeconds(3));
            CompletableFuture.runAsync(() -> {
                try {
                    h.release();
                } catch (InterruptedException e) {
                    throw new RuntimeException(e);
                }
            }).get(10, TimeUnit.SECONDS);
            assertTrue(c.query(k).isFree());
            assertFalse(h.lost().isDone());
        }
    }

    @Test
    void watchesSeeEveryChangeAndCloseCleanly() throws Exception {
        try (BatonClient c = client()) {
            String k = key("watched");
            LinkedBlockingQueue<WatchState> states = new LinkedBlockingQueue<>();
            Watch w = c.watch(k, states::add);
            WatchState first = states.poll(5, TimeUnit.SECONDS);
            assertTrue(first != null && first.isFree());
            Grant g = c.acquire(k, LEASE, null, AcquireOptions.none().value("me"));
            WatchState held = states.poll(5, TimeUnit.SECONDS);
            assertEquals(g.token(), held.token());
            assertEquals("me", held.value());
            g.release();
            WatchState free = states.poll(5, TimeUnit.SECONDS);
            assertEquals(0, free.token());
            assertNull(free.value());
            w.close();
            c.acquire(k, LEASE).release();
            assertNull(states.poll(300, TimeUnit.MILLISECONDS), "nothing after close");
        }
    }

    @Test
    void anElection() throws Exception {
        try (BatonClient a = client(); BatonClient b = client()) {
            String k = key("election");
            LinkedBlockingQueue<WatchState> leaders = new LinkedBlockingQueue<>();
            Watch observer = b.observe(k, leaders::add);
            assertEquals(0, leaders.poll(5, TimeUnit.SECONDS).token());
            HeldGrant lead = a.campaign(k, "10.0.0.1:80", Duration.ofSeconds(3));
            CompletableFuture<HeldGrant> next = b.campaignAsync(k, "10.0.0.2:80", Duration.ofSeconds(3), null, null);
            WatchState now = leaders.poll(5, TimeUnit.SECONDS);
            assertEquals("10.0.0.1:80", now.value());
            assertEquals("10.0.0.1:80", b.leader(k).value());
            lead.resign();
            HeldGrant second = next.get(10, TimeUnit.SECONDS);
            WatchState after = null;
            while (after == null || after.token() == 0) {
                after = leaders.poll(5, TimeUnit.SECONDS);
            }
            assertEquals("10.0.0.2:80", after.value());
            assertTrue(Long.compareUnsigned(after.token(), now.token()) > 0);
            assertEquals(second.token(), b.leaderAsync(k).get(10, TimeUnit.SECONDS).token());
            observer.close();
            second.resign();
        }
    }

    @Test
    void aPublisherDeliversOnDemand() throws Exception {
        try (BatonClient c = client()) {
            String k = key("published");
            LinkedBlockingQueue<WatchState> got = new LinkedBlockingQueue<>();
            CountDownLatch subscribed = new CountDownLatch(1);
            Flow.Subscription[] sub = new Flow.Subscription[1];
            c.watchPublisher(k).subscribe(new Flow.Subscriber<>() {
                @Override
                public void onSubscribe(Flow.Subscription s) {
                    sub[0] = s;
                    subscribed.countDown();
                    s.request(1);
                }

                @Override
                public void onNext(WatchState item) {
                    got.add(item);
                }

                @Override
                public void onError(Throwable t) {}

                @Override
                public void onComplete() {}
            });
            assertTrue(subscribed.await(5, TimeUnit.SECONDS));
            assertTrue(got.poll(5, TimeUnit.SECONDS).isFree());
            c.acquire(k, LEASE).release();
            assertNull(got.poll(300, TimeUnit.MILLISECONDS), "no demand, nothing delivered");
            sub[0].request(5);
            assertTrue(got.poll(5, TimeUnit.SECONDS) != null);
            sub[0].cancel();
        }
    }

    private static Set<String> batonThreads() {
        return Thread.getAllStackTraces().keySet().stream()
            .filter(Thread::isAlive)
            .map(Thread::getName)
            .filter(n -> n.startsWith("baton-"))
            .collect(Collectors.toSet());
    }

    @Test
    void closeStopsEveryThreadItStartedAndReleasesHeldGrants() throws Exception {
        Set<String> before = batonThreads();
        BatonClient c = client();
        String k = key("closing");
        HeldGrant h = c.hold(k, Duration.ofSeconds(10));
        Watch w = c.watch(k, s -> {});
        Grant plain = c.acquire(key("plain"), LEASE);
        Set<String> during = batonThreads();
        assertTrue(during.containsAll(List.of("baton-scheduler", "baton-conn " + node.addr)), during.toString());
        c.close();
        assertEquals(before, batonThreads(), "no thread of the client is left");
        assertTrue(w.isClosed());
        assertThrows(ClosedException.class, h::release);
        assertThrows(ClosedException.class, plain::release);
        assertThrows(ClosedException.class, () -> c.query(k));
        try (BatonClient other = client()) {
            assertTrue(other.query(k).isFree(), "close released the held grant");
        }
    }

    /**
     * Close releases a held key, which the server hands at once to this same
     * client's waiter on its other connection: that grant must reach no
     * caller (the waiter's call fails closed) and must be released before the
     * sockets close, else the key stays held for its whole lease. Racy by
     * nature: 20 rounds.
     */
    @Test
    void closeLeavesNoGrantItsOwnReleaseHandedToItsOwnWaiter() throws Exception {
        try (BatonClient obs = client()) {
            for (int round = 0; round < 20; round++) {
                CompletableFuture<Grant> waiter = new CompletableFuture<>();
                try (BatonClient c = client()) {
                    String k = key("own-waiter-" + round);
                    c.hold(k, LEASE);
                    Thread t = new Thread(() -> {
                        try {
                            waiter.complete(c.acquire(k, LEASE));
                        } catch (Throwable e) {
                            waiter.completeExceptionally(e);
                        }
                    }, "own-waiter");
                    t.setDaemon(true);
                    t.start();
                    waiting(obs, k, 1);
                    c.close();
                    assertTrue(obs.query(k).isFree(), "round " + round + ": the key is free right after close");
                }
                ExecutionException e = assertThrows(ExecutionException.class, () -> waiter.get(10, TimeUnit.SECONDS));
                assertTrue(e.getCause() instanceof ClosedException, "round " + round + ": " + e.getCause());
            }
        }
    }

    /** {@link #closeLeavesNoGrantItsOwnReleaseHandedToItsOwnWaiter} with the async calls. */
    @Test
    void closeLeavesNoGrantItsOwnReleaseHandedToItsOwnWaiterAsync() throws Exception {
        try (BatonClient obs = client()) {
            for (int round = 0; round < 20; round++) {
                CompletableFuture<Grant> waiter;
                try (BatonClient c = client()) {
                    String k = key("own-waiter-async-" + round);
                    c.holdAsync(k, LEASE, null, AcquireOptions.none(), null).get(10, TimeUnit.SECONDS);
                    waiter = c.acquireAsync(k, LEASE, null);
                    waiting(obs, k, 1);
                    c.close();
                    assertTrue(obs.query(k).isFree(), "round " + round + ": the key is free right after close");
                }
                ExecutionException e = assertThrows(ExecutionException.class, () -> waiter.get(10, TimeUnit.SECONDS));
                assertTrue(e.getCause() instanceof ClosedException, "round " + round + ": " + e.getCause());
            }
        }
    }

    @Test
    void aClientStartsWithNoServerUpAndFailsUnavailable() throws Exception {
        int port = Batond.freePort();
        try (BatonClient c = BatonClient.connect("127.0.0.1:" + port)) {
            assertThrows(UnavailableException.class, () -> c.query("k"));
            assertThrows(UnavailableException.class, () -> c.acquire("k", LEASE));
        }
    }
}
