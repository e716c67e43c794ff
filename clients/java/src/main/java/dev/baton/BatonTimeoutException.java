package dev.baton;

/**
 * The key was not granted within the wait asked for (the server answered
 * {@code T}, or a try-acquire found the key taken). Nothing is held: a
 * timed-out acquire never leaks a grant.
 */
public class BatonTimeoutException extends BatonException {
    private static final long serialVersionUID = 1L;

    /**
     * A timeout with a message.
     *
     * @param message what timed out
     */
    public BatonTimeoutException(String message) {
        super(message);
    }
}
