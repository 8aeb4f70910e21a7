package fleet

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/caddy-tollgate/limiter"
)

// Connection is everything that identifies one Redis client: handlers with
// equal Connections share one client.
type Connection struct {
	// Addresses are host:port pairs: one for a standalone server, several
	// cluster seeds, or the sentinels when SentinelMaster is set.
	Addresses []string `json:"addresses"`
	// Cluster uses cluster mode even with a single seed.
	Cluster bool `json:"cluster,omitempty"`
	// SentinelMaster is the master the sentinels in Addresses monitor.
	SentinelMaster string `json:"sentinel_master,omitempty"`
	// Username and Password authenticate (ACL users work).
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
	// DB selects a database (not in a cluster).
	DB int `json:"db,omitempty"`
	// TLS, when set, encrypts the connection.
	TLS *TLS `json:"tls,omitempty"`
	// PoolSize is the number of connections per node; 0 is go-redis's
	// default (10 per CPU).
	PoolSize int `json:"pool_size,omitempty"`
	// Timeout is the deadline of every call; 0 means
	// limiter.DefaultRedisTimeout.
	Timeout time.Duration `json:"timeout"`
}

// TLS configures TLS to Redis.
type TLS struct {
	// InsecureSkipVerify accepts any server certificate (testing only).
	InsecureSkipVerify bool `json:"insecure_skip_verify,omitempty"`
	// CA is a PEM file of the CA that signed the server certificate;
	// empty means the system roots.
	CA string `json:"ca,omitempty"`
	// Cert and Key are a PEM client certificate and key for mutual TLS.
	Cert string `json:"cert,omitempty"`
	Key  string `json:"key,omitempty"`
	// ServerName is the name to verify the certificate against; empty
	// means the host of the first address.
	ServerName string `json:"server_name,omitempty"`
}

// timeout is Timeout with its default.
func (c Connection) timeout() time.Duration {
	if c.Timeout > 0 {
		return c.Timeout
	}
	return limiter.DefaultRedisTimeout
}

// key identifies the client. The password enters only as a digest, so it
// never sits in a map key that could be printed.
func (c Connection) key() string {
	k := c
	k.Timeout = c.timeout()
	if k.Password != "" {
		sum := sha256.Sum256([]byte(k.Password))
		k.Password = "sha256:" + hex.EncodeToString(sum[:])
	}
	b, _ := json.Marshal(k)
	return "redis/" + string(b)
}

// options translates the connection into go-redis options.
func (c Connection) options() (*redis.UniversalOptions, error) {
	timeout := c.timeout()
	opts := &redis.UniversalOptions{
		// Clipped: a cluster client appends the nodes it discovers to
		// its Addrs in place, and a slice with room to spare (two
		// connections cut from one array) would have two clients write
		// the same memory (a data race the race detector caught).
		Addrs:         slices.Clip(c.Addresses),
		IsClusterMode: c.Cluster,
		MasterName:    c.SentinelMaster,
		Username:      c.Username,
		Password:      c.Password,
		DB:            c.DB,
		PoolSize:      c.PoolSize,
		ClientName:    "tollgate",
		// RESP2: Tollgate needs no RESP3 push notifications, and with RESP3
		// go-redis checks for them around every command (about 6% of a
		// decision's CPU in a profile under load).
		Protocol: 2,
		// Each call carries its own deadline (the store's timeout); let the
		// socket deadlines follow the context, and keep dial and socket
		// timeouts near it so nothing waits on a dead server for long.
		ContextTimeoutEnabled: true,
		DialTimeout:           max(timeout, 250*time.Millisecond),
		ReadTimeout:           timeout,
		WriteTimeout:          timeout,
		PoolTimeout:           timeout,
		// No retries by go-redis: it would send a pipeline again after a
		// read timed out or the connection broke, and Redis may have run
		// the first copy (a paused Redis runs both when it resumes): a
		// decision or a lease charged twice, a slot acquired again after
		// its release. A failed call goes to the fail mode and, when it
		// moves units a tenant used, to the Recorder, which retries it
		// under its id.
		MaxRetries: -1,
	}
	if c.TLS != nil {
		tc, err := c.TLS.config(c.Addresses)
		if err != nil {
			return nil, err
		}
		opts.TLSConfig = tc
	}
	return opts, nil
}

// config builds the client TLS configuration, loading the files.
func (t *TLS) config(addrs []string) (*tls.Config, error) {
	tc := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: t.InsecureSkipVerify, //nolint:gosec // operator's explicit choice, documented as testing only
		ServerName:         t.ServerName,
	}
	if tc.ServerName == "" && len(addrs) > 0 {
		if host, _, err := net.SplitHostPort(addrs[0]); err == nil {
			tc.ServerName = host
		}
	}
	if t.CA != "" {
		pem, err := os.ReadFile(t.CA)
		if err != nil {
			return nil, fmt.Errorf("redis tls ca: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("redis tls ca: no PEM certificate in %s", t.CA)
		}
		tc.RootCAs = pool
	}
	if t.Cert != "" || t.Key != "" {
		cert, err := tls.LoadX509KeyPair(t.Cert, t.Key)
		if err != nil {
			return nil, fmt.Errorf("redis tls cert/key: %v", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// client is a shared go-redis client and the hook that remembers its
// failed dials.
type client struct {
	redis.UniversalClient
	dials *dialErrors
}

// clients holds one client per distinct Connection. Every handler (and
// every config generation across reloads) with the same connection shares
// the client; the last release closes it, so reloads neither reconnect nor
// leak connections.
var clients pool[*client]

// acquireClient returns the shared client of c; release it with
// releaseClient(c.key()).
func acquireClient(c Connection) (*client, error) {
	return clients.acquire(c.key(), func() (*client, error) {
		opts, err := c.options()
		if err != nil {
			return nil, err
		}
		rc := redis.NewUniversalClient(opts)
		dials := new(dialErrors)
		rc.AddHook(dials)
		return &client{rc, dials}, nil
	})
}

// releaseClient drops one use of the client of key, closing it when it was
// the last.
func releaseClient(key string, c *client) error {
	if clients.release(key) {
		return c.Close()
	}
	return nil
}
