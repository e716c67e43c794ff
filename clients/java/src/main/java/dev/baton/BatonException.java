package dev.baton;

/**
 * The base of every error the baton client raises. It is unchecked: each
 * kind of failure is a subclass, so callers catch the ones they act on
 * ({@link BatonTimeoutException}, {@link LostException},
 * {@link UnavailableException}, {@link RefusedException},
 * {@link ClosedException}, {@link BatonArgumentException}) and let the rest
 * travel.
 */
public class BatonException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    /**
     * An error with a one-line message.
     *
     * @param message what went wrong
     */
    public BatonException(String message) {
        super(message);
    }

    /**
     * An error with a one-line message and its cause.
     *
     * @param message what went wrong
     * @param cause the underlying error
     */
    public BatonException(String message, Throwable cause) {
        super(message, cause);
    }
}
