package dev.baton;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** The examples of docs/clients.md's Java section, as written there, against a real batond. */
@Timeout(60)
class DocsExamplesTest {
    private static Batond node;
    private static int written;

    @BeforeAll
    static void start() throws Exception {
        node = Batond.start();
    }

    @AfterAll
    static void stop() throws Exception {
        node.close();
    }

    static void writeBatch(int batch, long fence) {
        written++;
    }

    static boolean moreWork() {
        return written++ < 3;
    }

    static void step(long token) {}

    static void alert(LostException why) {}

    static void runOneRound(long token) {}

    static CompletableFuture<Void> writeInvoicesAsync(long token) {
        return CompletableFuture.completedFuture(null);
    }

    @Test
    void theExamplesRun() throws Exception {
        try (BatonClient client = BatonClient.builder(node.addr).build()) {
            // A lock around a job.
            try (Grant grant = client.acquire("nightly-report", Duration.ofSeconds(30), Duration.ofSeconds(10))) {
                for (int batch = 0; batch < 100; batch++) {
                    writeBatch(batch, grant.token());      // the store refuses older tokens
                    grant.keep(Duration.ofSeconds(30));    // long job: renew the lease
                }
            } catch (BatonTimeoutException e) {
                System.out.println("someone else is writing the report");
            }
            assertEquals(100, written);
            assertTrue(client.query("nightly-report").isFree());

            written = 0;
            HeldGrant held = client.hold("reindex", Duration.ofSeconds(10), null, AcquireOptions.none(),
                    lost -> System.err.println("lost the lock: " + lost.getMessage()));
            try (held) {
                while (!held.isLost() && moreWork()) {
                    step(held.token());
                }
            }
            held.lost().thenAccept(why -> alert(why)); // a CompletableFuture<LostException>
            assertTrue(client.query("reindex").isFree());

            client.acquireAsync("invoices", Duration.ofSeconds(30), Duration.ofSeconds(10))
                  .thenCompose(grant -> writeInvoicesAsync(grant.token()).thenCompose(done -> grant.releaseAsync()))
                  .get(10, TimeUnit.SECONDS);
            assertTrue(client.query("invoices").isFree());

            AcquireOptions encoders = AcquireOptions.none().limit(4).value("host-a");
            try (Grant slot = client.acquire("encoders", Duration.ofSeconds(30), null, encoders)) {
                System.out.println("encoder slot " + slot.slot() + " of 4");
            }

            WatchState now = client.leader("scheduler");            // now.token() == 0: nobody leads
            assertTrue(now.isFree());
            Watch leaders = client.observe("scheduler", state ->
                    System.out.println(state.isFree() ? "nobody" : "leader: " + state.value()));
            try (HeldGrant leading = client.campaign("scheduler", "10.0.0.7:8080", Duration.ofSeconds(10))) {
                int rounds = 0;
                while (!leading.isLost() && rounds++ < 3) {
                    runOneRound(leading.token());
                }
                assertEquals("10.0.0.7:8080", client.leader("scheduler").value());
            } // resigns: the next candidate in line leads
            leaders.close();
            assertTrue(client.leader("scheduler").isFree());

            long token = -1L; // 2^64 - 1: the largest token there is
            long lastAccepted = Long.MAX_VALUE;
            assertTrue(Long.compareUnsigned(token, lastAccepted) > 0, "not stale, though negative as a long");
            assertEquals("18446744073709551615", Long.toUnsignedString(token));
        }
    }
}
