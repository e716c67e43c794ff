package dev.baton;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyFactory;
import java.security.KeyStore;
import java.security.PrivateKey;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.security.spec.PKCS8EncodedKeySpec;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collection;
import java.util.List;
import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;

/**
 * Builds an {@link SSLContext} for {@link BatonClient.Builder#tls} from the
 * PEM files a baton deployment uses: the CA that signed the servers'
 * certificates, and for mTLS the client's certificate and its PKCS#8 private
 * key ({@code BEGIN PRIVATE KEY}; RSA, EC or Ed25519).
 *
 * <pre>{@code
 * SSLContext tls = BatonTls.context(Path.of("ca.pem"), null, null);
 * BatonClient client = BatonClient.builder("10.0.0.1:7373").tls(tls).build();
 * }</pre>
 */
public final class BatonTls {
    private BatonTls() {}

    /**
     * A TLS context (TLS 1.3 or 1.2).
     *
     * @param caPem the CA certificates to trust (PEM); null: the system's roots
     * @param certPem the client certificate chain for mTLS (PEM), or null
     * @param keyPem the client's PKCS#8 private key (PEM), or null; required with {@code certPem}
     * @return the context
     * @throws BatonArgumentException when a file cannot be read or parsed
     */
    public static SSLContext context(Path caPem, Path certPem, Path keyPem) {
        try {
            TrustManagerFactory tmf = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
            if (caPem == null) {
                tmf.init((KeyStore) null);
            } else {
                KeyStore trust = KeyStore.getInstance(KeyStore.getDefaultType());
                trust.load(null, null);
                int i = 0;
                for (Certificate c : certificates(caPem)) {
                    trust.setCertificateEntry("ca" + i++, c);
                }
                if (i == 0) {
                    throw new BatonArgumentException("no certificate in " + caPem);
                }
                tmf.init(trust);
            }
            KeyManagerFactory kmf = null;
            if (certPem != null || keyPem != null) {
                if (certPem == null || keyPem == null) {
                    throw new BatonArgumentException("a client certificate needs both its certificate and its key");
                }
                List<Certificate> chain = new ArrayList<>(certificates(certPem));
                if (chain.isEmpty()) {
                    throw new BatonArgumentException("no certificate in " + certPem);
                }
                PrivateKey key = privateKey(keyPem);
                KeyStore ks = KeyStore.getInstance(KeyStore.getDefaultType());
                ks.load(null, null);
                char[] pw = new char[0];
                ks.setKeyEntry("client", key, pw, chain.toArray(new Certificate[0]));
                kmf = KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
                kmf.init(ks, pw);
            }
            SSLContext ctx = SSLContext.getInstance("TLS");
            ctx.init(kmf == null ? null : kmf.getKeyManagers(), tmf.getTrustManagers(), null);
            return ctx;
        } catch (IOException | GeneralSecurityException e) {
            throw new BatonArgumentException("cannot set TLS up: " + e.getMessage());
        }
    }

    private static Collection<? extends Certificate> certificates(Path pem) throws IOException,
        GeneralSecurityException {
        byte[] bytes = Files.readAllBytes(pem);
        return CertificateFactory.getInstance("X.509").generateCertificates(new ByteArrayInputStream(bytes));
    }

    private static PrivateKey privateKey(Path pem) throws IOException, GeneralSecurityException {
        String text = Files.readString(pem, StandardCharsets.US_ASCII);
        String begin = "-----BEGIN PRIVATE KEY-----";
        int a = text.indexOf(begin);
        int b = text.indexOf("-----END PRIVATE KEY-----");
        if (a < 0 || b < a) {
            throw new BatonArgumentException(pem + " holds no PKCS#8 private key (BEGIN PRIVATE KEY)");
        }
        byte[] der = Base64.getMimeDecoder().decode(text.substring(a + begin.length(), b));
        PKCS8EncodedKeySpec spec = new PKCS8EncodedKeySpec(der);
        GeneralSecurityException last = null;
        for (String alg : new String[] {"EC", "RSA", "Ed25519", "EdDSA"}) {
            try {
                return KeyFactory.getInstance(alg).generatePrivate(spec);
            } catch (GeneralSecurityException e) {
                last = e;
            }
        }
        throw last;
    }
}
