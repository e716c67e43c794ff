package dev.baton;

/**
 * A grant no longer holds its key: a keep or release was answered "not
 * held" (the lease ran out and the key went on, or it was released
 * elsewhere), or the lease ran out by the client's own clock before any
 * server confirmed a keep. Every later call on that grant fails with this.
 */
public class LostException extends BatonException {
    private static final long serialVersionUID = 1L;

    /**
     * A lost grant.
     *
     * @param message which grant and why
     */
    public LostException(String message) {
        super(message);
    }
}
