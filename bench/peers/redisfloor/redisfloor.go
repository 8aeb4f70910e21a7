// Package redisfloor is the yardstick for what a strict decision costs
// Redis, measured in the same run as bench/run.sh's strict scenarios: each
// request runs the floor script, the least any decision in Redis must do
// (TIME, GET, SET ... PX), and the calls are pipelined the way Tollgate's
// store sends its decisions (queued; at most two batches in flight, each
// taking the calls queued when it starts, up to 256, after letting the goroutines
// already runnable queue theirs). Its Redis CPU and script time per
// request are the floor a decision is compared with on the same machine
// at the same moment: on shared cores the same script costs several
// times what it costs on an idle Redis. It is a benchmark yardstick, not
// part of Tollgate.
//
//	redis_floor {
//		address 127.0.0.1:6379
//		key     {http.request.header.X-Tenant}
//	}
package redisfloor

import (
	"context"
	"errors"
	"net/http"
	"runtime"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/redis/go-redis/v9"
)

func init() {
	caddy.RegisterModule(Handler{})
	httpcaddyfile.RegisterHandlerDirective("redis_floor", parseCaddyfile)
	httpcaddyfile.RegisterDirectiveOrder("redis_floor", httpcaddyfile.Before, "respond")
}

// floor is the script bench/scripts.sh calls the floor: it reads Redis's
// clock, reads the key and writes it back with a TTL.
var floor = redis.NewScript(`local t = redis.call('TIME')
local v = redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], '0123456789abcdef', 'PX', 60000)
return {1, t[1]}`)

// inFlight is how many batches may wait for Redis at once, as many as
// Tollgate's store sends per node.
const inFlight = 2

// maxBatch caps one pipeline, as Tollgate's store does; the rest waits
// for the next batch.
const maxBatch = 256

// callTimeout bounds a batch's exchange with Redis.
const callTimeout = time.Second

// Handler runs the floor script for each request's key, pipelined with
// the other requests' calls, and passes the request on.
type Handler struct {
	// Address is the Redis server's host:port.
	Address string `json:"address,omitempty"`
	// Key is the placeholder whose value names the request's key.
	Key string `json:"key,omitempty"`

	rdb   *redis.Client
	calls *queue
}

// queue holds the calls waiting for a batch, and counts the flushers
// sending them.
type queue struct {
	mu      sync.Mutex
	calls   []*call
	running int
}

// call is one request's script call waiting for its batch.
type call struct {
	key  string
	done chan error
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.redis_floor",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision makes the go-redis client (it connects on first use); the key
// defaults to the client's address.
func (h *Handler) Provision(caddy.Context) error {
	if h.Key == "" {
		h.Key = "{http.request.remote.host}"
	}
	h.rdb = redis.NewClient(&redis.Options{Addr: h.Address, MaxRetries: -1})
	h.calls = new(queue)
	return nil
}

// Validate rejects a config without an address.
func (h *Handler) Validate() error {
	if h.Address == "" {
		return errors.New("redis_floor: address is required")
	}
	return nil
}

// Cleanup closes the go-redis client.
func (h *Handler) Cleanup() error {
	if h.rdb != nil {
		return h.rdb.Close()
	}
	return nil
}

// ServeHTTP runs the floor script for the request's key, then the next
// handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	c := &call{key: "rl:floor:{" + repl.ReplaceAll(h.Key, "") + "}:api", done: make(chan error, 1)}
	q := h.calls
	q.mu.Lock()
	q.calls = append(q.calls, c)
	start := q.running < inFlight
	if start {
		q.running++
	}
	q.mu.Unlock()
	if start {
		go h.flush()
	}
	if err := <-c.done; err != nil {
		return caddyhttp.Error(http.StatusServiceUnavailable, err)
	}
	return next.ServeHTTP(w, r)
}

// flush sends the queued calls as one pipeline, batch after batch, until
// the queue is empty.
func (h *Handler) flush() {
	q := h.calls
	for {
		// The goroutines already runnable reach their call first and
		// ride this batch (the same yield as Tollgate's flusher).
		runtime.Gosched()
		q.mu.Lock()
		n := min(len(q.calls), maxBatch)
		batch := q.calls[:n:n]
		q.calls = q.calls[n:]
		if n == 0 {
			q.running--
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
		err := h.send(batch)
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
			err = floor.Load(ctx, h.rdb).Err()
			cancel()
			if err == nil {
				err = h.send(batch)
			}
		}
		for _, c := range batch {
			c.done <- err
		}
	}
}

// send runs the batch's calls in one pipeline; the first error is
// returned.
func (h *Handler) send(batch []*call) error {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	pipe := h.rdb.Pipeline()
	for _, c := range batch {
		floor.EvalSha(ctx, pipe, []string{c.key})
	}
	_, err := pipe.Exec(ctx)
	return err
}

// UnmarshalCaddyfile reads the redis_floor block.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive's name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		switch opt := d.Val(); opt {
		case "address", "key":
			if !d.NextArg() {
				return d.ArgErr()
			}
			if opt == "address" {
				h.Address = d.Val()
			} else {
				h.Key = d.Val()
			}
		default:
			return d.Errf("unknown option %q (want address or key)", opt)
		}
		if d.NextArg() {
			return d.ArgErr()
		}
	}
	return nil
}

func parseCaddyfile(helper httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	h := new(Handler)
	err := h.UnmarshalCaddyfile(helper.Dispenser)
	return h, err
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
	_ caddyfile.Unmarshaler       = (*Handler)(nil)
)
