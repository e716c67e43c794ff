package dev.baton;

import static org.junit.jupiter.api.Assertions.assertEquals;

import dev.baton.Conn.Phase;
import org.junit.jupiter.api.Test;

/**
 * The pool's choice of connection: in turn, down ones left out, the preferred node first,
 * a key's acquires apart.
 */
class PoolTest {
    private static final Phase UP = Phase.UP;
    private static final Phase DOWN = Phase.DOWN;
    private static final Phase CONNECTING = Phase.CONNECTING;

    @Test
    void upConnectionsAreUsedInTurn() {
        int[] nodes = {0, 0, 1};
        Phase[] phases = {UP, UP, UP};
        for (int t = 0; t < 6; t++) {
            assertEquals(t % 3, Pool.choose(nodes, phases, -1, t));
        }
    }

    @Test
    void aConnectionThatIsDownIsLeftOut() {
        for (int t = 0; t < 5; t++) {
            assertEquals(1, Pool.choose(new int[] {0, 1, 2}, new Phase[] {DOWN, UP, CONNECTING}, -1, t));
        }
    }

    @Test
    void withNoneUpACallerWaitsOnlyForOneConnecting() {
        assertEquals(Pool.WAIT, Pool.choose(new int[] {0, 1}, new Phase[] {DOWN, CONNECTING}, -1, 0));
        assertEquals(Pool.NOTHING, Pool.choose(new int[] {0, 1}, new Phase[] {DOWN, DOWN}, -1, 0));
        assertEquals(Pool.NOTHING, Pool.choose(new int[0], new Phase[0], -1, 0));
    }

    @Test
    void thePreferredNodeComesFirstAndIsWaitedForWhileConnecting() {
        assertEquals(1, Pool.choose(new int[] {0, 1, 1}, new Phase[] {UP, UP, UP}, 1, 0));
        assertEquals(2, Pool.choose(new int[] {0, 1, 1}, new Phase[] {UP, UP, UP}, 1, 1));
        assertEquals(Pool.WAIT, Pool.choose(new int[] {0, 1}, new Phase[] {UP, CONNECTING}, 1, 0));
        assertEquals(0, Pool.choose(new int[] {0, 1}, new Phase[] {UP, DOWN}, 1, 0));
    }

    @Test
    void anAcquireGoesWhereNoneOfItsKeyIsOutstanding() {
        int[] nodes = {0, 0, 0};
        Phase[] phases = {UP, UP, DOWN};
        for (int t = 0; t < 4; t++) {
            assertEquals(1, Pool.choose(nodes, phases, new boolean[] {true, false, false}, -1, t));
        }
        // Every one busy: still sent, round-robin.
        assertEquals(0, Pool.choose(new int[] {0, 0}, new Phase[] {UP, UP}, new boolean[] {true, true}, -1, 0));
        assertEquals(1, Pool.choose(new int[] {0, 0}, new Phase[] {UP, UP}, new boolean[] {true, true}, -1, 1));
        // A free connection elsewhere does not beat the preferred node (it
        // would only redirect back).
        assertEquals(1, Pool.choose(new int[] {0, 1}, new Phase[] {UP, UP}, new boolean[] {false, true}, 1, 0));
    }

    @Test
    void anAcquireWhoseKeyEveryUpConnectionIsBusyWithWaitsForOneConnecting() {
        // A new client's second connection is not up yet, and the first has
        // this client's acquire of the key waiting: wait for the second.
        int[] nodes = {0, 0};
        Phase[] phases = {UP, CONNECTING};
        boolean[] busy = {true, false};
        assertEquals(Pool.WAIT, Pool.choose(nodes, phases, busy, -1, 0));
        assertEquals(Pool.WAIT, Pool.choose(nodes, phases, busy, 0, 1), "within the preferred node too");
        // The wait is over (settle) and it is still connecting: the busy one.
        assertEquals(0, Pool.choose(nodes, phases, busy, true, -1, 0));
        // None connecting: the busy one at once.
        assertEquals(0, Pool.choose(nodes, new Phase[] {UP, DOWN}, busy, -1, 0));
        // The one connecting came up: it is used, waiting or settled.
        for (int t = 0; t < 2; t++) {
            assertEquals(1, Pool.choose(nodes, new Phase[] {UP, UP}, busy, -1, t));
            assertEquals(1, Pool.choose(nodes, new Phase[] {UP, UP}, busy, true, -1, t));
        }
        // Not busy (any other request): used at once whatever is connecting.
        assertEquals(0, Pool.choose(nodes, phases, new boolean[] {false, false}, -1, 0));
        assertEquals(0, Pool.choose(nodes, phases, -1, 0));
        // The preferred node's busy one, none of it connecting, beats waiting
        // for another node (which would only redirect back).
        assertEquals(0, Pool.choose(new int[] {0, 1}, phases, busy, 0, 0));
    }

    @Test
    void aRequestHeldBackNeverMakesItsConnectionOverdue() {
        long s = 1_000_000_000L;
        long budget = 5 * s;
        // Held back long past its budget: only the caller's deadline counts.
        assertEquals(Calls.Verdict.NOT_YET, Calls.pastDeadline(60 * s, budget, false, 0, Pool.NONE));
        assertEquals(Calls.Verdict.HELD_BACK, Calls.pastDeadline(6 * s, budget, false, 0, 5 * s));
        // At the front since 10 s: its budget runs from then.
        assertEquals(Calls.Verdict.NOT_YET, Calls.pastDeadline(14 * s, budget, true, 10 * s, Pool.NONE));
        assertEquals(Calls.Verdict.CONN_OVERDUE, Calls.pastDeadline(15 * s, budget, true, 10 * s, Pool.NONE));
        assertEquals(Calls.Verdict.CALLER_OVERDUE, Calls.pastDeadline(14 * s, budget, true, 10 * s, 12 * s));
        // No budget (an acquire without a wait limit): never overdue.
        assertEquals(Calls.Verdict.NOT_YET, Calls.pastDeadline(99 * s, -1, true, 0, Pool.NONE));
    }
}
