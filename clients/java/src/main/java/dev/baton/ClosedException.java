package dev.baton;

/**
 * A call on a client that was closed, or on a grant that was already
 * released (a second release).
 */
public class ClosedException extends BatonException {
    private static final long serialVersionUID = 1L;

    /**
     * A call on something closed.
     *
     * @param message what was closed
     */
    public ClosedException(String message) {
        super(message);
    }
}
