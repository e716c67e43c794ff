package dev.baton;

import java.time.Duration;

/**
 * Who holds a key now, as {@link BatonClient#query} found it.
 *
 * @param key the key asked about
 * @param token the token of the newest live grant of the key, unsigned
 *     (read it with {@link Long#toUnsignedString(long)}); 0 when the key is free
 * @param timeLeft the time left on that grant's lease, by the server's clock
 *     (zero when free)
 * @param waiting how many acquires wait in line for the key
 */
public record KeyStatus(String key, long token, Duration timeLeft, long waiting) {
    /**
     * Whether no grant holds the key.
     *
     * @return true when the key is free
     */
    public boolean isFree() {
        return token == 0;
    }

    /**
     * The token as an unsigned decimal ("0" when free).
     *
     * @return the token's decimal text
     */
    public String tokenString() {
        return Long.toUnsignedString(token);
    }
}
