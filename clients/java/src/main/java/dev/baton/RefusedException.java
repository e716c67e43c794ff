package dev.baton;

/**
 * The server refused the request (an {@code E} answer), or refused this
 * client's secret. {@link #reason()} is the server's reason word exactly,
 * e.g. {@code limit-mismatch}, {@code bad-lease}, {@code lease-too-long},
 * {@code too-many-watches}, {@code bad-auth}, {@code auth-required}.
 */
public class RefusedException extends BatonException {
    private static final long serialVersionUID = 1L;

    /** The server's reason word. */
    private final String reason;

    /**
     * A refusal.
     *
     * @param reason the server's reason word
     * @param message a one-line description
     */
    public RefusedException(String reason, String message) {
        super(message);
        this.reason = reason;
    }

    /**
     * The server's reason word, e.g. {@code limit-mismatch}.
     *
     * @return the reason word
     */
    public String reason() {
        return reason;
    }
}
