// Package redisrate is the peer of bench/run.sh: the rate limit a user
// would write themselves with go-redis/redis_rate, as a Caddy handler. Each
// request is one GCRA decision, one EVALSHA and one round trip to Redis,
// with nothing batched or cached. It is a benchmark yardstick, not part of
// Tollgate.
//
//	redis_rate {
//		address 127.0.0.1:6379
//		rate    100 per minute
//		burst   100
//		key     {http.request.header.X-Tenant}
//	}
package redisrate

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

func init() {
	caddy.RegisterModule(Handler{})
	httpcaddyfile.RegisterHandlerDirective("redis_rate", parseCaddyfile)
	httpcaddyfile.RegisterDirectiveOrder("redis_rate", httpcaddyfile.Before, "respond")
}

// Handler allows Rate requests per Period (with Burst) per Key, a
// placeholder, and answers 429 beyond that.
type Handler struct {
	Address string         `json:"address,omitempty"`
	Rate    int            `json:"rate,omitempty"`
	Burst   int            `json:"burst,omitempty"`
	Period  caddy.Duration `json:"period,omitempty"`
	Key     string         `json:"key,omitempty"`

	rdb     *redis.Client
	limiter *redis_rate.Limiter
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.redis_rate",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision makes the go-redis client (it connects on first use); burst
// defaults to the rate, the key to the client's address.
func (h *Handler) Provision(caddy.Context) error {
	if h.Burst == 0 {
		h.Burst = h.Rate
	}
	if h.Key == "" {
		h.Key = "{http.request.remote.host}"
	}
	h.rdb = redis.NewClient(&redis.Options{Addr: h.Address})
	h.limiter = redis_rate.NewLimiter(h.rdb)
	return nil
}

// Validate rejects a config without an address, a rate or a period.
func (h *Handler) Validate() error {
	if h.Address == "" || h.Rate <= 0 || h.Period <= 0 || h.Burst < 0 {
		return errors.New("redis_rate: address, rate and period are required, burst not negative")
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

// ServeHTTP takes one decision in Redis for the request's key.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	key := repl.ReplaceAll(h.Key, "")
	res, err := h.limiter.Allow(r.Context(), key, redis_rate.Limit{Rate: h.Rate, Burst: h.Burst, Period: time.Duration(h.Period)})
	if err != nil {
		return caddyhttp.Error(http.StatusServiceUnavailable, err)
	}
	w.Header().Set("X-RateLimit-Remaining", strconv.Itoa(res.Remaining))
	if res.Allowed == 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(res.RetryAfter.Seconds()+0.999)))
		w.WriteHeader(http.StatusTooManyRequests)
		return nil
	}
	return next.ServeHTTP(w, r)
}

// UnmarshalCaddyfile reads the redis_rate block.
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
		case "burst":
			if !d.NextArg() {
				return d.ArgErr()
			}
			n, err := strconv.Atoi(d.Val())
			if err != nil || n <= 0 {
				return d.Errf("burst: want a positive integer, not %q", d.Val())
			}
			h.Burst = n
		case "rate": // rate <n> per <second|minute|hour>
			args := d.RemainingArgs()
			if len(args) != 3 || args[1] != "per" {
				return d.Err("rate: want <n> per <second|minute|hour>")
			}
			n, err := strconv.Atoi(args[0])
			if err != nil || n <= 0 {
				return d.Errf("rate: want a positive integer, not %q", args[0])
			}
			periods := map[string]time.Duration{"second": time.Second, "minute": time.Minute, "hour": time.Hour}
			p, ok := periods[args[2]]
			if !ok {
				return d.Errf("rate: per second, minute or hour, not %q", args[2])
			}
			h.Rate, h.Period = n, caddy.Duration(p)
		default:
			return d.Errf("unknown option %q", opt)
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
