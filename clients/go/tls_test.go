package baton

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// pki is a throwaway CA with a server certificate for 127.0.0.1 and a
// client certificate, written as PEM files.
type pki struct {
	dir                string
	ca, cert, key      string // the CA, the server's certificate and key
	clientCert         tls.Certificate
	pool               *x509.CertPool
	caKey              *ecdsa.PrivateKey
	caTemplate, caCert *x509.Certificate
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	p := &pki{dir: t.TempDir(), pool: x509.NewCertPool()}
	var err error
	p.caKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p.caTemplate = &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "baton test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, p.caTemplate, p.caTemplate, &p.caKey.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	p.caCert, _ = x509.ParseCertificate(der)
	p.pool.AddCert(p.caCert)
	p.ca = p.write(t, "ca.pem", "CERTIFICATE", der)
	serverDER, serverKey := p.issue(t, 2, x509.ExtKeyUsageServerAuth)
	p.cert = p.write(t, "server.pem", "CERTIFICATE", serverDER)
	p.key = p.write(t, "server.key", "PRIVATE KEY", serverKey)
	clientDER, clientKey := p.issue(t, 3, x509.ExtKeyUsageClientAuth)
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: clientDER})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: clientKey})
	if p.clientCert, err = tls.X509KeyPair(certPEM, keyPEM); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *pki) issue(t *testing.T, serial int64, usage x509.ExtKeyUsage) (der, key []byte) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	der, err = x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &k.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	key, err = x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return der, key
}

func (p *pki) write(t *testing.T, name, kind string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestMutualTLS(t *testing.T) {
	p := newPKI(t)
	n := startNode(t, freeAddr(t), "--tls-cert", p.cert, "--tls-key", p.key, "--tls-client-ca", p.ca)
	ctx := context.Background()

	c, err := New([]string{n.addr}, WithTLS(&tls.Config{RootCAs: p.pool, Certificates: []tls.Certificate{p.clientCert}}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	g, err := c.Acquire(ctx, "tls", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	states, err := c.Watch(ctx, "tls")
	if err != nil {
		t.Fatal(err)
	}
	if s := <-states; s.Token != g.Token() {
		t.Fatalf("%+v", s)
	}
	if err := g.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// A server the client's roots do not know is never used.
	untrusting, _ := New([]string{n.addr}, WithTLS(&tls.Config{Certificates: []tls.Certificate{p.clientCert}}),
		WithConnectTimeout(500*time.Millisecond))
	defer untrusting.Close()
	if _, err := untrusting.Query(ctx, "tls"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("an unknown issuer: %v", err)
	}
}
