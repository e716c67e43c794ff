package dev.baton;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import org.junit.jupiter.api.Test;

/**
 * The wire format: tokens as unsigned 64-bit numbers, requests written, answers parsed and
 * routed, arguments checked before anything is sent.
 */
class WireTest {
    @Test
    void tokensAboveLongMaxValueReadAsUnsigned() throws Exception {
        Wire.Answer a = Wire.parse("A 18446744073709551615 k");
        assertEquals(-1L, a.token);
        assertEquals("18446744073709551615", Long.toUnsignedString(a.token));
        Wire.Answer b = Wire.parse("A 9223372036854775808 k 3");
        assertEquals("9223372036854775808", Long.toUnsignedString(b.token));
        assertTrue(Long.compareUnsigned(b.token, Long.MAX_VALUE) > 0);
        assertEquals(3, b.slot);
        assertThrows(Wire.WireError.class, () -> Wire.parse("A 18446744073709551616 k"));
        String r = new String(Wire.release("k", -1L).line(), StandardCharsets.UTF_8);
        assertEquals("R k 18446744073709551615\n", r);
    }

    @Test
    void requestsAreFormattedWithMillisecondSeconds() {
        assertEquals("A job 30.000 0.000\n", text(Wire.acquire("job", 30000, 0, null, null)));
        assertEquals("A job 0.500 2.125 1 host-a\n", text(Wire.acquire("job", 500, 2125, null, "host-a")));
        assertEquals("A job 1.000 0.001 4\n", text(Wire.acquire("job", 1000, 1, 4, null)));
        assertEquals("K job 7 10.050\n", text(Wire.keep("job", 7, 10050)));
    }

    private static String text(Wire.Request r) {
        return new String(r.line(), StandardCharsets.UTF_8);
    }

    @Test
    void answersParseAndRouteToTheirRequest() throws Exception {
        assertEquals('A', Wire.parse("T k").routeOp());
        assertEquals('R', Wire.parse("N k").routeOp());
        assertEquals('K', Wire.parse("M 10.0.0.1:7373 K k").routeOp());
        assertEquals('A', Wire.parse("E A k limit-mismatch").routeOp());
        assertEquals(0, Wire.parse("E - - bad-auth").routeOp());
        Wire.Answer w = Wire.parse("W k 5 2 1 -");
        assertNull(w.value);
        assertEquals(2, w.holders);
        Wire.Answer q = Wire.parse("Q k 0 0 3\r");
        assertEquals(3, q.waiting);
        for (String bad : List.of("", "A", "A x k", "Z k", "A 1  k", "W k 1 2 3", "M - Z k", "Q k 1 2")) {
            assertThrows(Wire.WireError.class, () -> Wire.parse(bad), bad);
        }
    }

    @Test
    void argumentsAreCheckedBeforeAnythingIsSent() {
        assertThrows(BatonArgumentException.class, () -> Wire.checkKey("a b"));
        assertThrows(BatonArgumentException.class, () -> Wire.checkKey(""));
        assertThrows(BatonArgumentException.class, () -> Wire.checkKey("k".repeat(251)));
        Wire.checkKey("ключ");
        assertThrows(BatonArgumentException.class, () -> Wire.checkLease(Duration.ZERO));
        assertEquals(2, Wire.checkLease(Duration.ofNanos(1_000_001)));
        assertEquals(0, Wire.checkWait(null));
        assertEquals(1, Wire.checkWait(Duration.ZERO));
        assertThrows(BatonArgumentException.class, () -> Wire.checkWait(Duration.ofMillis(-1)));
        assertThrows(BatonArgumentException.class, () -> AcquireOptions.none().limit(0));
        assertThrows(BatonArgumentException.class, () -> AcquireOptions.none().limit(10001));
        assertThrows(BatonArgumentException.class, () -> AcquireOptions.none().value("a b"));
        assertThrows(BatonArgumentException.class, () -> Wire.checkSecret("short"));
    }

    @Test
    void addressesAreNormalised() {
        assertEquals(List.of("lock-1:7373", "lock-2:7000", "[::1]:7373"),
            Wire.parseServers(List.of("lock-1", " lock-2:7000", "lock-1:7373", "[::1]")));
        assertThrows(BatonArgumentException.class, () -> Wire.parseServers(List.of("lock-1:http")));
        assertThrows(BatonArgumentException.class, () -> Wire.parseServers(List.of()));
    }
}
