package dev.baton;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.junit.jupiter.api.Test;

/** The pending table: answers matched to requests per (op, key), in send order. */
class PendingTest {
    @Test
    void answersForOneOpAndKeyAreMatchedInSendOrder() {
        Pending<Integer> p = new Pending<>();
        p.push('A', "a", 1);
        p.push('A', "b", 2);
        p.push('A', "a", 3);
        p.push('R', "a", 4);
        Object[] out = new Object[1];
        assertTrue(p.take('R', "a", out));
        assertEquals(4, out[0]);
        assertTrue(p.take('A', "a", out));
        assertEquals(1, out[0]);
        assertTrue(p.take('A', "a", out));
        assertEquals(3, out[0]);
        assertFalse(p.take('A', "a", out));
        assertTrue(p.take('A', "b", out));
        assertEquals(2, out[0]);
        assertTrue(p.isEmpty());
    }

    @Test
    void requestsNobodyWaitsForKeepTheirPlace() {
        Pending<Integer> p = new Pending<>();
        p.push('R', "a", null);
        p.push('R', "a", 9);
        Object[] out = new Object[1];
        assertTrue(p.take('R', "a", out));
        assertEquals(null, out[0]);
        assertTrue(p.take('R', "a", out));
        assertEquals(9, out[0]);
        p.push('I', null, 5);
        p.push('Q', "k", null);
        assertEquals(java.util.List.of(5), p.drain());
        assertEquals(0, p.size());
    }

    @Test
    void theFrontOfEachLineIsKnown() {
        Pending<Integer> p = new Pending<>();
        assertTrue(p.push('A', "a", 1));
        assertFalse(p.push('A', "a", 2));
        assertTrue(p.push('A', "b", 3));
        assertTrue(p.has('A', "a"));
        assertFalse(p.has('R', "a"));
        assertEquals(1, p.front('A', "a"));
        Object[] out = new Object[1];
        assertTrue(p.take('A', "a", out));
        assertEquals(2, p.front('A', "a"));
        assertTrue(p.take('A', "a", out));
        assertFalse(p.has('A', "a"));
        assertEquals(null, p.front('A', "a"));
    }

    @Test
    void whetherAnyRequestOfAnOpIsOutstanding() {
        Pending<Integer> p = new Pending<>();
        assertFalse(p.hasOp('A'));
        p.push('A', "a", 1);
        p.push('R', "b", null);
        p.push('I', null, 2);
        assertTrue(p.hasOp('A'));
        assertTrue(p.hasOp('R'));
        assertFalse(p.hasOp('K'));
        Object[] out = new Object[1];
        assertTrue(p.take('A', "a", out));
        assertFalse(p.hasOp('A'), "a line emptied is gone");
        assertTrue(p.take('R', "b", out));
        assertFalse(p.hasOp('R'));
        assertTrue(p.hasOp('I'));
    }
}
