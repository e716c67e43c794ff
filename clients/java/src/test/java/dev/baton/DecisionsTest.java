package dev.baton;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotSame;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** Section 4's decisions, against a scripted node in this process. */
@Timeout(30)
class DecisionsTest {
    private static final Duration LEASE = Duration.ofSeconds(30);

    @Test
    void oneAddressGetsTwoConnectionsUsedRoundRobin() throws Exception {
        try (FakeServer fake = new FakeServer(FakeServer::plain);
             BatonClient client = BatonClient.connect(fake.addr)) {
            fake.awaitLinks(2);
            List<Integer> used = new ArrayList<>();
            for (int i = 0; i < 4; i++) {
                client.query("k");
                used.add(fake.next("Q").link().index);
            }
            assertEquals(2, fake.links.size());
            for (int i = 1; i < used.size(); i++) {
                assertTrue(!used.get(i).equals(used.get(i - 1)), "round robin: " + used);
            }
        }
    }

    @Test
    void notHeldAfterARetryCountsAsReleased() throws Exception {
        AtomicInteger releases = new AtomicInteger();
        try (FakeServer fake = new FakeServer(l -> {
            if (l.text().startsWith("R ")) {
                if (releases.incrementAndGet() == 1) {
                    l.link().drop(); // the first attempt may have got through
                } else {
                    l.link().send("N k");
                }
            } else {
                FakeServer.plain(l);
            }
        }); BatonClient client = BatonClient.connect(fake.addr)) {
            Grant g = client.acquire("k", LEASE);
            g.release(); // no LostException: the retry's N means the first got through
            assertEquals(2, releases.get());
            assertThrows(ClosedException.class, g::release);
        }
    }

    @Test
    void notHeldToTheFirstAttemptMeansLost() throws Exception {
        try (FakeServer fake = new FakeServer(l -> {
            if (l.text().startsWith("R ")) {
                l.link().send("N k");
            } else {
                FakeServer.plain(l);
            }
        }); BatonClient client = BatonClient.connect(fake.addr)) {
            Grant g = client.acquire("k", LEASE);
            assertThrows(LostException.class, g::release);
            assertThrows(LostException.class, g::release);
        }
    }

    @Test
    void aReleaseIsRetriedUntilAConnectionComesBack() throws Exception {
        AtomicInteger releases = new AtomicInteger();
        try (FakeServer fake = new FakeServer(l -> {
            if (l.text().startsWith("R ") && releases.incrementAndGet() <= 2) {
                l.link().drop(); // both connections drop: none is live for ~3 s
            } else {
                FakeServer.plain(l);
            }
        }); BatonClient client = BatonClient.connect(fake.addr)) {
            Grant g = client.acquire("k", LEASE);
            long start = System.nanoTime();
            g.release();
            long tookMs = (System.nanoTime() - start) / 1_000_000;
            assertEquals(3, releases.get());
            assertTrue(tookMs >= 2500 && tookMs < 5500, "released by the 3 s reconnect: " + tookMs + " ms");
        }
    }

    @Test
    void aRedirectIsFollowedToTheActiveNode() throws Exception {
        try (FakeServer active = new FakeServer(FakeServer::plain);
             FakeServer standby = new FakeServer(l -> {
                 String[] f = l.text().split(" ");
                 if (f[0].equals("A")) {
                     l.link().send("M " + "127.0.0.1:" + active.server.getLocalPort() + " A " + f[1]);
                 }
             });
             BatonClient client = BatonClient.connect(standby.addr)) {
            Grant g = client.acquire("k", LEASE);
            assertEquals(7, g.token());
            assertTrue(client.servers().contains(active.addr), client.servers().toString());
            client.query("k");
            assertEquals(0, active.next("Q").link().index); // later calls go to the active node
        }
    }

    @Test
    void aGrantArrivingAfterTheCallerGaveUpIsReleasedAtOnce() throws Exception {
        try (FakeServer fake = new FakeServer(l -> {
            if (!l.text().startsWith("A ")) {
                FakeServer.plain(l);
            }
        }); BatonClient client = BatonClient.connect(fake.addr)) {
            CompletableFuture<Grant> f = client.acquireAsync("k", LEASE, null);
            FakeServer.Line a = fake.next("A k");
            f.cancel(false);
            a.link().send("A 9 k");
            FakeServer.Line r = fake.next("R ");
            assertEquals("R k 9", r.text());
        }
    }

    @Test
    void anInterruptedAcquireReleasesALateGrant() throws Exception {
        try (FakeServer fake = new FakeServer(l -> {
            if (!l.text().startsWith("A ")) {
                FakeServer.plain(l);
            }
        }); BatonClient client = BatonClient.connect(fake.addr)) {
            Thread caller = Thread.currentThread();
            Thread t = new Thread(() -> {
                try {
                    FakeServer.Line a = fake.next("A k");
                    caller.interrupt();
                    Thread.sleep(100);
                    a.link().send("A 11 k");
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            });
            t.start();
            assertThrows(InterruptedException.class, () -> client.acquire("k", LEASE));
            t.join();
            assertEquals("R k 11", fake.next("R ").text());
        }
    }

    @Test
    void aGrantThatWaitedInLineIsConfirmedWithKeep() throws Exception {
        try (FakeServer fake = new FakeServer(l -> {
            if (l.text().startsWith("A ")) {
                new Thread(() -> {
                    try {
                        Thread.sleep(250);
                    } catch (InterruptedException e) {
                        return;
                    }
                    l.link().send("A 5 k");
                }).start();
            } else {
                FakeServer.plain(l);
            }
        }); BatonClient client = BatonClient.connect(fake.addr)) {
            Grant g = client.acquire("k", Duration.ofMillis(600));
            assertEquals("K k 5 0.600", fake.next("K ").text());
            assertTrue(g.timeLeft().toMillis() > 450, g.timeLeft().toString());
        }
    }

    @Test
    void anAcquireMovesToTheNextConnectionWhenItsConnectionDrops() throws Exception {
        AtomicInteger acquires = new AtomicInteger();
        try (FakeServer fake = new FakeServer(l -> {
            if (l.text().startsWith("A ") && acquires.incrementAndGet() == 1) {
                l.link().drop();
            } else {
                FakeServer.plain(l);
            }
        }); BatonClient client = BatonClient.connect(fake.addr)) {
            fake.awaitLinks(2);
            assertEquals(7, client.acquire("k", LEASE).token());
            assertEquals(2, acquires.get());
        }
    }

    /**
     * A fake that lets the first connection through U at once and hands the
     * second's link to {@code held} unanswered (later ones are left
     * unanswered too); an acquire with a 30 s lease (the waiter) is answered
     * only when one with a 20 s lease (the try) comes on its link: granted,
     * before that one's T, as the server answers in order.
     */
    private static FakeServer secondUpLate(CompletableFuture<FakeServer.Link> held) throws Exception {
        AtomicInteger us = new AtomicInteger();
        AtomicReference<FakeServer.Link> waiter = new AtomicReference<>();
        return new FakeServer(l -> {
            String t = l.text();
            if (t.startsWith("U ")) {
                if (us.incrementAndGet() == 1) {
                    l.link().send("U ok");
                } else {
                    held.complete(l.link());
                }
            } else if (t.startsWith("A k 30.")) {
                waiter.set(l.link());
            } else if (t.startsWith("A k 20.")) {
                if (waiter.get() == l.link()) {
                    l.link().send("A 5 k");
                }
                l.link().send("T k");
            } else if (t.equals("I")) {
                // Close asks (the waiter is outstanding) before it closes.
                l.link().send("I role=active");
            }
        });
    }

    @Test
    void aTryAcquireWaitsForTheSecondConnectionRatherThanQueueBehindItsOwnWaiter() throws Exception {
        CompletableFuture<FakeServer.Link> held = new CompletableFuture<>();
        try (FakeServer fake = secondUpLate(held);
             // Timeouts a loaded machine cannot outlast: the second connection
             // stays connecting, and the try waits, until the test lets it through.
             BatonClient client = BatonClient.builder(fake.addr).auth("0123456789abcdef-right")
                 .connectTimeout(Duration.ofMinutes(1)).requestTimeout(Duration.ofMinutes(1)).build()) {
            CompletableFuture<Grant> waiter = client.acquireAsync("k", LEASE, LEASE);
            FakeServer.Line waiting = fake.next("A k 30.");
            FakeServer.Link second = held.get(10, TimeUnit.SECONDS);
            // The only connection up is busy with k and the other is
            // connecting: the pool decides before acquireAsync returns, and
            // waits for a connection (without the rule it would send the try
            // behind the waiter at once).
            CompletableFuture<Grant> tried = client.acquireAsync("k", Duration.ofSeconds(20), Duration.ZERO);
            second.send("U ok");
            ExecutionException e = assertThrows(ExecutionException.class, () -> tried.get(10, TimeUnit.SECONDS));
            assertInstanceOf(BatonTimeoutException.class, e.getCause());
            FakeServer.Line tryLine = fake.next("A k 20.");
            assertSame(second, tryLine.link(), "the try goes on the connection that came up");
            assertNotSame(second, waiting.link());
            assertFalse(waiter.isDone());
        }
    }

    @Test
    void aTryAcquireWhoseOtherConnectionNeverComesUpUsesTheBusyOne() throws Exception {
        CompletableFuture<FakeServer.Link> held = new CompletableFuture<>();
        try (FakeServer fake = secondUpLate(held);
             BatonClient client = BatonClient.builder(fake.addr).auth("0123456789abcdef-right")
                 .connectTimeout(Duration.ofMillis(200)).build()) {
            CompletableFuture<Grant> waiter = client.acquireAsync("k", LEASE, LEASE);
            FakeServer.Line waiting = fake.next("A k 30.");
            // The second connection's U is never answered: once it gives up,
            // the busy one serves (blocking client; the fake answers the
            // waiter, then the T).
            assertThrows(BatonTimeoutException.class, () -> client.tryAcquire("k", Duration.ofSeconds(20)));
            assertSame(waiting.link(), fake.next("A k 20.").link());
            assertEquals(5, waiter.get(10, TimeUnit.SECONDS).token());
        }
    }

    @Test
    void aWrongSecretIsRefusedWithTheServersReason() throws Exception {
        try (FakeServer fake = new FakeServer(l -> {
            if (l.text().startsWith("U ")) {
                l.link().send("E - - bad-auth");
                l.link().drop();
            }
        }); BatonClient client = BatonClient.builder(fake.addr).auth("0123456789abcdef-wrong").build()) {
            RefusedException e = assertThrows(RefusedException.class, () -> client.query("k"));
            assertEquals("bad-auth", e.reason());
        }
    }

    /**
     * Close begins while an acquire confirms its grant with K (it came after
     * half its lease): the call releases the grant itself before the sockets
     * close and fails closed, rather than hand a grant nobody can release
     * any more to its caller. The blocking client.
     */
    @Test
    void closeWhileAGrantIsConfirmedReleasesItAndTheAcquireFailsClosed() throws Exception {
        closeWhileConfirming(false);
    }

    /** The same with the async client. */
    @Test
    void closeWhileAnAsyncAcquiresGrantIsConfirmedReleasesItAndTheFutureFailsClosed() throws Exception {
        closeWhileConfirming(true);
    }

    private static void closeWhileConfirming(boolean async) throws Exception {
        CompletableFuture<FakeServer.Link> heldK = new CompletableFuture<>();
        try (FakeServer fake = new FakeServer(l -> {
            String t = l.text();
            if (t.startsWith("A ")) {
                new Thread(() -> {
                    try {
                        Thread.sleep(150); // it waited in line: half its lease
                    } catch (InterruptedException e) {
                        return;
                    }
                    l.link().send("A 5 k");
                }).start();
            } else if (t.startsWith("K ")) {
                heldK.complete(l.link()); // answered once close began
            } else {
                FakeServer.plain(l);
            }
        })) {
            BatonClient client = BatonClient.connect(fake.addr);
            Duration lease = Duration.ofMillis(300);
            CompletableFuture<Grant> acquired = async
                ? client.acquireAsync("k", lease, null)
                : CompletableFuture.supplyAsync(() -> {
                    try {
                        return client.acquire("k", lease);
                    } catch (InterruptedException e) {
                        throw new java.util.concurrent.CompletionException(e);
                    }
                });
            FakeServer.Link k = heldK.get(10, TimeUnit.SECONDS);
            Thread closer = new Thread(client::close, "closer");
            closer.start();
            long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
            while (!client.isClosed()) {
                assertTrue(System.nanoTime() < end, "close began");
                Thread.sleep(1);
            }
            k.send("K k");
            closer.join(10_000);
            assertFalse(closer.isAlive(), "close returned");
            ExecutionException e = assertThrows(ExecutionException.class, () -> acquired.get(10, TimeUnit.SECONDS));
            assertInstanceOf(ClosedException.class, e.getCause(), String.valueOf(e.getCause()));
            List<String> releases = new ArrayList<>();
            for (FakeServer.Line l : fake.seen) {
                if (l.text().startsWith("R ")) {
                    releases.add(l.text());
                }
            }
            assertEquals(List.of("R k 5"), releases, "the grant released before the sockets closed");
        }
    }
}
