package tollgate

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// countingAlgorithms are the algorithms with a per-window count.
var countingAlgorithms = []string{"token_bucket", "gcra", "sliding_window", "fixed_window", "sliding_log"}

// fleetCaddyfile has one route per counting algorithm (/<algo>), each a
// policy of limit 100 per hour per tenant, and a concurrency policy on
// /slow in front of upstream.
func fleetCaddyfile(redisBlock, upstream string) string {
	var routes strings.Builder
	for _, algo := range countingAlgorithms {
		fmt.Fprintf(&routes, `
	route /%[1]s {
		rate_limit {
			%[2]s
			tenant {http.request.header.X-Tenant}
			policy %[1]s {
				algorithm %[1]s
				limit 100
				window 1h
			}
		}
		respond "ok"
	}`, algo, redisBlock)
	}
	return fmt.Sprintf(`{
	admin 127.0.0.1:{ADMIN}
	auto_https off
	log {
		output discard
	}
}

http://127.0.0.1:{PORT} {
%s
	route /slow {
		rate_limit {
			%s
			tenant {http.request.header.X-Tenant}
			policy inflight {
				algorithm concurrency
				limit 5
			}
		}
		reverse_proxy %s
	}
}
`, routes.String(), redisBlock, upstream)
}

// TestFleetExact: three Caddy processes on one Redis share each tenant's
// budget exactly: 600 concurrent requests for one tenant, spread over the
// three, admit exactly 100 for every counting algorithm; another tenant is
// untouched; concurrency never exceeds its limit across the fleet.
func TestFleetExact(t *testing.T) {
	redistest.RequireBinaries(t)
	t.Run("standalone", func(t *testing.T) {
		srv := redistest.StartStandalone(t, redistest.Options{})
		testFleetExact(t, fleetRedisBlock(srv.Addr))
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.StartCluster(t, 3, 0)
		testFleetExact(t, fleetRedisBlock(strings.Join(c.Addrs, " ")))
	})
}

// fleetRedisBlock points the fleet at Redis with a deadline generous
// enough for a loaded 2-core machine: this test measures the store's
// exactness, and a timed-out call would be decided by the default fail
// mode (local), which admits on its own.
func fleetRedisBlock(addrs string) string {
	return fmt.Sprintf("redis {\n\t\t\t\taddress %s\n\t\t\t\ttimeout 5s\n\t\t\t}", addrs)
}

func testFleetExact(t *testing.T, redisBlock string) {
	var inflight, maxInflight atomic.Int64
	release := make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inflight.Add(1)
		for {
			m := maxInflight.Load()
			if n <= m || maxInflight.CompareAndSwap(m, n) {
				break
			}
		}
		<-release
		inflight.Add(-1)
	}))
	defer upstream.Close()
	// Runs before upstream.Close, which waits for blocked handlers.
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	defer unblock()

	cfg := fleetCaddyfile(redisBlock, strings.TrimPrefix(upstream.URL, "http://"))
	fleet := []*caddyProcess{startCaddyProcess(t, cfg), startCaddyProcess(t, cfg), startCaddyProcess(t, cfg)}

	for _, algo := range countingAlgorithms {
		var admitted, other, errors atomic.Int64
		var wg sync.WaitGroup
		for i := range 600 {
			wg.Go(func() {
				status, err := tenantGet(t, fleet[i%3].base+"/"+algo, "acme")
				if err != nil {
					errors.Add(1)
				} else if status == 200 {
					admitted.Add(1)
				}
			})
			if i%20 == 0 {
				wg.Go(func() {
					status, err := tenantGet(t, fleet[i%3].base+"/"+algo, "globex")
					if err != nil {
						errors.Add(1)
					} else if status == 200 {
						other.Add(1)
					}
				})
			}
		}
		wg.Wait()
		if admitted.Load() != 100 || other.Load() != 30 || errors.Load() != 0 {
			t.Errorf("%s: admitted %d of 600 for acme (want exactly 100), %d of 30 for globex (want 30), %d errors",
				algo, admitted.Load(), other.Load(), errors.Load())
		}
	}

	// Concurrency: 30 requests held at the upstream, limit 5 fleet-wide.
	var wg sync.WaitGroup
	var admitted atomic.Int64
	for i := range 30 {
		wg.Go(func() {
			if status, err := tenantGet(t, fleet[i%3].base+"/slow", "acme"); err == nil && status == 200 {
				admitted.Add(1)
			}
		})
	}
	// Wait until the fleet holds its 5 slots (the rest are denied fast).
	waitFor(t, func() bool { return inflight.Load() >= 5 })
	unblock()
	wg.Wait()
	if maxInflight.Load() != 5 || admitted.Load() < 5 {
		t.Errorf("concurrency: max in flight %d (want 5), admitted %d (want >= 5)", maxInflight.Load(), admitted.Load())
	}
}

// tenantGet sends newGet(url, tenant) and returns the response status.
func tenantGet(t *testing.T, url, tenant string) (int, error) {
	res, err := testClient.Do(newGet(t, url, tenant))
	if err != nil {
		return 0, err
	}
	res.Body.Close()
	return res.StatusCode, nil
}

func newGet(t *testing.T, url, tenant string) *http.Request {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Tenant", tenant)
	return req
}
