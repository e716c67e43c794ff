package dev.baton;

/**
 * What an acquire may ask for beyond its key, lease and wait: the key's
 * limit (a semaphore) and the holder's value. Immutable; the default
 * ({@link #none()}) asks for neither, a plain mutex.
 *
 * <pre>{@code
 * AcquireOptions gpu = AcquireOptions.none().limit(4).value("host-a");
 * Grant grant = client.acquire("gpu", Duration.ofSeconds(30), null, gpu);
 * System.out.println("slot " + grant.slot() + " of 4");
 * }</pre>
 */
public final class AcquireOptions {
    private static final AcquireOptions NONE = new AcquireOptions(null, null);

    private final Integer limit;
    private final String value;

    private AcquireOptions(Integer limit, String value) {
        this.limit = limit;
        this.value = value;
    }

    /**
     * Neither a limit nor a value.
     *
     * @return the empty options
     */
    public static AcquireOptions none() {
        return NONE;
    }

    /**
     * Up to {@code limit} grants may hold the key at once (1 to 10000). Every
     * acquire of the key names the same limit while it has a holder or a
     * waiter; another is refused ({@link RefusedException} with reason
     * {@code limit-mismatch}).
     *
     * @param limit 1 to 10000
     * @return options with this limit
     * @throws BatonArgumentException when the limit is out of range
     */
    public AcquireOptions limit(int limit) {
        Wire.checkLimit(limit);
        return new AcquireOptions(limit, value);
    }

    /**
     * The holder's value (an address, a host name): 1 to 250 bytes of UTF-8,
     * no spaces or control characters. Watchers see the value of the newest
     * grant. A value without a limit is sent with limit 1.
     *
     * @param value the holder's value
     * @return options with this value
     * @throws BatonArgumentException when the value is not acceptable
     */
    public AcquireOptions value(String value) {
        Wire.checkValue(value);
        return new AcquireOptions(limit, value);
    }

    /**
     * The limit asked for.
     *
     * @return the limit, or null for none (a plain mutex)
     */
    public Integer limit() {
        return limit;
    }

    /**
     * The value asked for.
     *
     * @return the value, or null for none
     */
    public String value() {
        return value;
    }
}
