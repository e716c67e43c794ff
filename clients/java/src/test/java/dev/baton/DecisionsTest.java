package dev.baton;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.atomic.AtomicInteger;
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
}
