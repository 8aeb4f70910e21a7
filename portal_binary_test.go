package tollgate

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// portalFleetCaddyfile: the API behind rate_limit on Redis, the tenant's
// view at /limits.
const portalFleetCaddyfile = `{
	admin 127.0.0.1:{ADMIN}
	auto_https off
}
:{PORT} {
	handle /limits {
		rate_limit_usage
	}
	handle {
		rate_limit {
			redis {REDIS}
			denials_stream
			tenant {http.request.header.X-Tenant}
			policy api {
				algorithm fixed_window
				limit 20
				window 1h
			}
		}
		respond "ok"
	}
}
`

// TestBinaryPortalFleet: three instances on one Redis, three tenants
// whose requests go round the instances. Once the instances have flushed,
// every instance shows each tenant its fleet-wide usage, in the JSON and
// on the page: per minute what was admitted and denied, equal to what the
// Redis bucket counted, its own denials and nothing of the others. A new instance started after one
// was stopped shows the same history (it lives in Redis).
func TestBinaryPortalFleet(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	cf := strings.Replace(portalFleetCaddyfile, "{REDIS}", srv.Addr, 1)
	ps := []*caddyProcess{startCaddyProcess(t, cf), startCaddyProcess(t, cf), startCaddyProcess(t, cf)}
	// All traffic inside one minute.
	if s := time.Now().Second(); s > 45 {
		time.Sleep(time.Duration(61-s) * time.Second)
	}
	minute := time.Now().UTC().Truncate(time.Minute).Format(time.RFC3339)
	sent := map[string]int{"pf_one": 25, "pf_two": 7, "pf_three": 3}
	admitted, denied := map[string]int{}, map[string]int{}
	for tenant, n := range sent {
		for i := range n {
			switch r := ps[i%3].request("GET", "/", "X-Tenant", tenant); r.status {
			case http.StatusOK:
				admitted[tenant]++
			case http.StatusTooManyRequests:
				denied[tenant]++
			default:
				t.Fatalf("%s: %d", tenant, r.status)
			}
		}
	}
	if admitted["pf_one"] != 20 || denied["pf_one"] != 5 || admitted["pf_two"] != 7 {
		t.Fatalf("admitted %v, denied %v", admitted, denied)
	}
	// What Redis counted: the fixed windows' counters (struct.pack
	// '<dd': the window's start, then its count).
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer c.Close()
	counted := func(tenant string) int {
		keys, err := c.Keys(context.Background(), "rl:fixed_window:{"+tenant+"}:api*").Result()
		if err != nil || len(keys) != 1 {
			t.Fatalf("%s: keys %v %v", tenant, keys, err)
		}
		raw, err := c.Get(context.Background(), keys[0]).Bytes()
		if err != nil || len(raw) != 16 {
			t.Fatalf("%s: bucket %q %v", tenant, raw, err)
		}
		return int(math.Float64frombits(binary.LittleEndian.Uint64(raw[8:])))
	}
	ps[2].stop() // flushes its points as it stops
	time.Sleep(11 * time.Second)
	ps = append(ps[:2], startCaddyProcess(t, cf)) // a new instance, after a restart
	for i, p := range ps {
		for tenant := range sent {
			r := p.request("GET", "/limits", "X-Tenant", tenant, "Accept", "application/json")
			var v struct {
				Tenant   string `json:"tenant"`
				Policies []struct {
					Policy    string `json:"policy"`
					Remaining int64  `json:"remaining"`
					History   struct {
						Points []struct {
							At                       string
							Admitted, Denied, Shadow int
						} `json:"points"`
					} `json:"history"`
				} `json:"policies"`
				Denials []struct {
					Policy string `json:"policy"`
				} `json:"denials"`
			}
			if err := json.Unmarshal([]byte(r.body), &v); err != nil || r.status != http.StatusOK {
				t.Fatalf("instance %d, %s: %d %q", i, tenant, r.status, r.body)
			}
			if v.Tenant != tenant || len(v.Policies) != 1 {
				t.Fatalf("instance %d, %s: %+v", i, tenant, v)
			}
			p0 := v.Policies[0]
			got := map[string][2]int{}
			for _, pt := range p0.History.Points {
				if pt.Admitted != 0 || pt.Denied != 0 {
					got[pt.At] = [2]int{pt.Admitted, pt.Denied}
				}
			}
			want := map[string][2]int{minute: {admitted[tenant], denied[tenant]}}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("instance %d, %s: points %v, want %v", i, tenant, got, want)
			}
			if n := counted(tenant); n != admitted[tenant] || int64(20-n) != p0.Remaining {
				t.Errorf("instance %d, %s: Redis counted %d, history %d, remaining %d", i, tenant, n, admitted[tenant], p0.Remaining)
			}
			if len(v.Denials) != denied[tenant] {
				t.Errorf("instance %d, %s: %d denials listed, want %d", i, tenant, len(v.Denials), denied[tenant])
			}
			// The page shows the same minute, and no other tenant.
			page := p.request("GET", "/limits", "X-Tenant", tenant, "Accept", "text/html")
			bar := fmt.Sprintf(`data-at="%s" data-admitted="%d" data-denied="%d"`, minute, admitted[tenant], denied[tenant])
			if page.status != http.StatusOK || !strings.Contains(page.body, bar) || !strings.Contains(page.body, `id="tenant">`+tenant+`<`) {
				t.Errorf("instance %d, %s: the page lacks %s", i, tenant, bar)
			}
			for other := range sent {
				if other != tenant && (strings.Contains(r.body, other) || strings.Contains(page.body, other)) {
					t.Errorf("instance %d: %s's view names %s", i, tenant, other)
				}
			}
		}
	}
}
