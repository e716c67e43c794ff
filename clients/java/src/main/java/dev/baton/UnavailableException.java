package dev.baton;

/**
 * No server could be asked: every connection was down, every attempt's
 * connection dropped, a server did not answer within the request timeout,
 * or no active node was known within it. Trying again later may succeed.
 */
public class UnavailableException extends BatonException {
    private static final long serialVersionUID = 1L;

    /**
     * An unavailable service.
     *
     * @param message which servers were tried and what happened
     */
    public UnavailableException(String message) {
        super(message);
    }
}
