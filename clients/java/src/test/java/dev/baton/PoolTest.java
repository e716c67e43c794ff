package dev.baton;

import static org.junit.jupiter.api.Assertions.assertEquals;

import dev.baton.Conn.Phase;
import org.junit.jupiter.api.Test;

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
}
