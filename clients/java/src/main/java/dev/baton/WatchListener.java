package dev.baton;

/**
 * Receives a watch's states, in order, one at a time, on the client's
 * executor (never on a connection's thread): the first state of every new
 * subscription (also after a failover), then one per change.
 */
@FunctionalInterface
public interface WatchListener {
    /**
     * A state of the watched key.
     *
     * @param state the key's holders now
     */
    void onState(WatchState state);

    /**
     * The watch ended for good: the server refused it (for instance
     * {@code too-many-watches}, with a {@link RefusedException}) or refused
     * this client's secret. No state follows. A watch never ends because no
     * server answers: it keeps trying until closed.
     *
     * @param error why the watch ended
     */
    default void onError(BatonException error) {}
}
