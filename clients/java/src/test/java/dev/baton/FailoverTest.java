package dev.baton;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** A two-node cluster: the active is killed, the client keeps working on the promoted standby. */
@Timeout(60)
class FailoverTest {
    @Test
    void theClientKeepsWorkingWhenTheActiveDies() throws Exception {
        int pa = Batond.freePort();
        int pb = Batond.freePort();
        String peers = "127.0.0.1:" + pa + ",127.0.0.1:" + pb;
        try (Batond a = Batond.node(pa, "--peers", peers, "--insecure-peers");
             Batond b = Batond.node(pb, "--peers", peers, "--insecure-peers")) {
            a.launch();
            b.launch();
            // Both addresses, the standby first: the client follows M to the active.
            try (BatonClient client = BatonClient.connect(b.addr, a.addr)) {
                Grant before = acquireSoon(client, "before", Duration.ofSeconds(30));
                LinkedBlockingQueue<WatchState> states = new LinkedBlockingQueue<>();
                Watch w = client.watch("watched", states::add);
                assertTrue(states.poll(10, TimeUnit.SECONDS).isFree());
                HeldGrant held = client.hold("held", Duration.ofSeconds(6));

                awaitReplicated(b, 2); // "before" and "held" are on the standby

                a.kill();

                // Calls go on through the promoted standby (retrying while it promotes).
                Grant after = acquireSoon(client, "after", Duration.ofSeconds(30));
                assertTrue(Long.compareUnsigned(after.token(), before.token()) > 0, "tokens grow across failover");
                after.release();
                before.release(); // the grant was replicated: released on the new active
                // The watch watched again on the new active and said its state.
                WatchState again = states.poll(15, TimeUnit.SECONDS);
                assertTrue(again != null && again.isFree(), "the watch survived failover");
                Grant g = client.acquire("watched", Duration.ofSeconds(30));
                WatchState seen;
                do {
                    seen = states.poll(10, TimeUnit.SECONDS);
                } while (seen != null && seen.token() != g.token());
                assertTrue(seen != null, "a change after failover was seen");
                g.release();
                // The held grant was kept alive across the failover.
                Thread.sleep(2500);
                assertFalse(held.isLost(), () -> "kept across failover: " + held.lost().getNow(null));
                assertEquals(held.token(), client.query("held").token());
                held.release();
                w.close();
            }
        }
    }

    /** Poll the standby's I until it holds {@code n} keys (bounded). */
    private static void awaitReplicated(Batond standby, int n) throws Exception {
        long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (System.nanoTime() < end) {
            try (java.net.Socket s = new java.net.Socket("127.0.0.1", standby.port)) {
                s.getOutputStream().write("I\n".getBytes(java.nio.charset.StandardCharsets.US_ASCII));
                String line = new java.io.BufferedReader(new java.io.InputStreamReader(s.getInputStream(),
                    java.nio.charset.StandardCharsets.US_ASCII)).readLine();
                for (String f : line.split(" ")) {
                    if (f.startsWith("held=") && Integer.parseInt(f.substring(5)) >= n) {
                        return;
                    }
                }
            }
            Thread.sleep(20);
        }
        throw new AssertionError("the standby never held " + n + " keys");
    }

    /** Acquire, retrying while the cluster has no active node yet (bounded). */
    private static Grant acquireSoon(BatonClient client, String key, Duration lease) throws Exception {
        long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
        while (true) {
            try {
                return client.acquire(key, lease, Duration.ofSeconds(5));
            } catch (UnavailableException e) {
                if (System.nanoTime() > end) {
                    throw e;
                }
                Thread.sleep(100);
            }
        }
    }
}
