package tollgate

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// meteredFleetCaddyfile is the config of each fleet instance: 100 tokens
// an hour per tenant, 30 per streamed response, decided on Redis strictly
// (/strict), from leases of up to 10 requests (/leased), on a sliding
// log (/log), and with cost_after openai on OpenAI-style streams that do
// not ask for their usage (/preset).
func meteredFleetCaddyfile(redisBlock, upstream string) string {
	route := func(path, extra string) string {
		costAfter, uri := "json usage.total_tokens", "/sse/"
		if path == "preset" {
			costAfter, uri = "openai", "/v1/"
		}
		return fmt.Sprintf(`
	route /%[1]s/* {
		rate_limit {
			%[2]s
			tenant {http.request.header.X-Tenant}
			policy mf_%[1]s {
				%[3]s
				limit 100
				window 1h
				cost_after %[5]s
			}
		}
		uri replace /%[1]s/ %[6]s
		reverse_proxy %[4]s
	}`, path, redisBlock, extra, upstream, costAfter, uri)
	}
	return `{
	admin 127.0.0.1:{ADMIN}
	auto_https off
	persist_config off
}

http://127.0.0.1:{PORT} {` +
		route("strict", "algorithm token_bucket") +
		route("leased", "algorithm token_bucket\n\t\t\t\tlease 10") +
		route("log", "algorithm sliding_log") +
		route("preset", "algorithm token_bucket\n\t\t\t\tlease 10") + `
}
`
}

// TestMeteredFleet: three built Caddy processes share 100 tokens per
// tenant through Redis (standalone, and a 3-master cluster called with
// functions); each streamed
// response reports 30 tokens. Requests go round the fleet: 4 pass, every
// later one gets a 429, whether decided strictly, from leases (the
// settlement is paid from leased units first) or on a sliding log.
func TestMeteredFleet(t *testing.T) {
	redistest.RequireBinaries(t)
	t.Run("standalone", func(t *testing.T) {
		srv := redistest.StartStandalone(t, redistest.Options{})
		testMeteredFleet(t, fleetRedisBlock(srv.Addr))
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.StartCluster(t, 3, 0)
		// With the function library (redis functions): FCALL per master.
		block := strings.Replace(fleetRedisBlock(strings.Join(c.Addrs, " ")), "timeout 5s", "timeout 5s\n\t\t\t\tfunctions", 1)
		testMeteredFleet(t, block)
	})
}

func testMeteredFleet(t *testing.T, redisBlock string) {
	up := newLLMUpstream(t)
	cfg := meteredFleetCaddyfile(redisBlock, up.addr)
	fleet := []*caddyProcess{startCaddyProcess(t, cfg), startCaddyProcess(t, cfg), startCaddyProcess(t, cfg)}
	for _, path := range []string{"strict", "leased", "log", "preset"} {
		for _, tenant := range []string{"acme", "beta"} {
			var got []int
			for i := range 9 {
				req, _ := http.NewRequest(http.MethodGet, fleet[i%3].base+"/"+path+"/x?tokens=30", nil)
				want := sseBody(30)
				if path == "preset" {
					// A stream that did not ask for its usage: asked for
					// it, and gets the stream without it.
					req, _ = http.NewRequest(http.MethodPost, fleet[i%3].base+"/preset/chat/completions?tokens=30",
						strings.NewReader(`{"model":"m","stream":true,"messages":[]}`))
					want = strings.Join(sseEvents(30, false), "")
				}
				req.Header.Set("X-Tenant", tenant)
				res, err := testClient.Do(req)
				if err != nil {
					t.Fatalf("%s %s request %d: %v", path, tenant, i+1, err)
				}
				body, err := io.ReadAll(res.Body)
				res.Body.Close()
				if err != nil {
					t.Fatal(err)
				}
				if res.StatusCode == 200 && string(body) != want {
					t.Errorf("%s request %d: the stream was changed on the way:\n%q", path, i+1, body)
				}
				got = append(got, res.StatusCode)
			}
			want := []int{200, 200, 200, 200, 429, 429, 429, 429, 429}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("%s, tenant %s, round the fleet: statuses %v, want %v (100 tokens, 30 per response)", path, tenant, got, want)
			}
		}
	}
}
