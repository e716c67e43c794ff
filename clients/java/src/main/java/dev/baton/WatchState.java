package dev.baton;

/**
 * A key's holders at one moment, as a watch sees them: the state when the
 * watch starts (or restarts on another node after a failover), then one after
 * each change of the key's set of holders (a grant, a release, an expiry).
 *
 * @param key the key watched
 * @param token the largest token holding the key now, unsigned (read it with
 *     {@link Long#toUnsignedString(long)}); 0 when nobody holds it
 * @param holders how many live grants hold the key
 * @param waiting how many acquires waited in line when the change happened
 * @param value the value of the grant with the largest token; null when none
 *     or when it carries no value
 */
public record WatchState(String key, long token, long holders, long waiting, String value) {
    /**
     * Whether no grant holds the key.
     *
     * @return true when the key is free (for an election: nobody leads)
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
