package tollgate

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
)

// redisClients holds one go-redis client per distinct connection config.
// Every handler (and every config generation across reloads) that uses the
// same connection shares the client; the last one to be cleaned up closes
// it, so reloads neither reconnect nor leak connections.
var redisClients = caddy.NewUsagePool()

type pooledRedisClient struct {
	redis.UniversalClient
	dials *dialErrors
}

// Destruct implements caddy.Destructor.
func (c pooledRedisClient) Destruct() error { return c.Close() }

// defaultRedisTimeout is the deadline of a Redis call when none is set.
const defaultRedisTimeout = 100 * time.Millisecond

// redisConnection is a RedisConfig with placeholders resolved and defaults
// applied: everything that identifies a client.
type redisConnection struct {
	Addresses      []string        `json:"addresses"`
	Cluster        bool            `json:"cluster,omitempty"`
	SentinelMaster string          `json:"sentinel_master,omitempty"`
	Username       string          `json:"username,omitempty"`
	Password       string          `json:"password,omitempty"`
	DB             int             `json:"db,omitempty"`
	TLS            *RedisTLSConfig `json:"tls,omitempty"`
	PoolSize       int             `json:"pool_size,omitempty"`
	Timeout        time.Duration   `json:"timeout"`
}

// connection resolves placeholders such as {env.REDIS_PASSWORD} in the
// fields where secrets and deployment details live.
func (rc *RedisConfig) connection() redisConnection {
	repl := caddy.NewReplacer()
	c := redisConnection{
		Cluster:        rc.Cluster,
		SentinelMaster: repl.ReplaceKnown(rc.SentinelMaster, ""),
		Username:       repl.ReplaceKnown(rc.Username, ""),
		Password:       repl.ReplaceKnown(rc.Password, ""),
		DB:             rc.DB,
		PoolSize:       rc.PoolSize,
		Timeout:        time.Duration(rc.Timeout),
	}
	for _, a := range rc.Addresses {
		c.Addresses = append(c.Addresses, repl.ReplaceKnown(a, ""))
	}
	if rc.TLS != nil {
		t := *rc.TLS
		t.CA = repl.ReplaceKnown(t.CA, "")
		t.Cert = repl.ReplaceKnown(t.Cert, "")
		t.Key = repl.ReplaceKnown(t.Key, "")
		t.ServerName = repl.ReplaceKnown(t.ServerName, "")
		c.TLS = &t
	}
	if c.Timeout <= 0 {
		c.Timeout = defaultRedisTimeout
	}
	return c
}

// poolKey identifies the client. The password enters only as a digest so
// it never sits in a map key that could be printed.
func (c redisConnection) poolKey() string {
	k := c
	if k.Password != "" {
		sum := sha256.Sum256([]byte(k.Password))
		k.Password = "sha256:" + hex.EncodeToString(sum[:])
	}
	b, _ := json.Marshal(k)
	return "redis/" + string(b)
}

// options translates the connection into go-redis options.
func (c redisConnection) options() (*redis.UniversalOptions, error) {
	opts := &redis.UniversalOptions{
		Addrs:         c.Addresses,
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
		DialTimeout:           max(c.Timeout, 250*time.Millisecond),
		ReadTimeout:           c.Timeout,
		WriteTimeout:          c.Timeout,
		PoolTimeout:           c.Timeout,
	}
	if c.TLS != nil {
		tc, err := c.TLS.tlsConfig(c.Addresses)
		if err != nil {
			return nil, err
		}
		opts.TLSConfig = tc
	}
	return opts, nil
}

// tlsConfig builds the client TLS configuration, loading the files.
func (t *RedisTLSConfig) tlsConfig(addrs []string) (*tls.Config, error) {
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

// loadRedisClient returns the shared client for c, creating it on first
// use. Release it with redisClients.Delete(key).
func loadRedisClient(c redisConnection) (redis.UniversalClient, *dialErrors, string, error) {
	key := c.poolKey()
	v, _, err := redisClients.LoadOrNew(key, func() (caddy.Destructor, error) {
		opts, err := c.options()
		if err != nil {
			return nil, err
		}
		client := redis.NewUniversalClient(opts)
		dials := new(dialErrors)
		client.AddHook(dials)
		return pooledRedisClient{client, dials}, nil
	})
	if err != nil {
		return nil, nil, "", err
	}
	pc := v.(pooledRedisClient)
	return pc.UniversalClient, pc.dials, key, nil
}
