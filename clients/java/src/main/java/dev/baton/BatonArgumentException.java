package dev.baton;

/**
 * An argument the library refuses before anything is sent: a key that is
 * not 1 to 250 bytes without spaces or control characters, a lease not
 * above 0, a negative wait, a limit outside 1 to 10000, a bad value, a
 * malformed address or secret. The message says what is accepted.
 */
public class BatonArgumentException extends BatonException {
    private static final long serialVersionUID = 1L;

    /**
     * A refused argument.
     *
     * @param message what is wrong and what is accepted
     */
    public BatonArgumentException(String message) {
        super(message);
    }
}
