package tollgate

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// readmeBlock returns the README's caddyfile example that contains want.
func readmeBlock(t *testing.T, want string) string {
	t.Helper()
	src, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range caddyfileBlock.FindAllStringSubmatch(string(src), -1) {
		if strings.Contains(m[1], want) {
			return m[1]
		}
	}
	t.Fatalf("no caddyfile example in the README contains %q", want)
	return ""
}

// clientFrom returns a client whose connections come from the loopback
// address ip (127.0.0.0/8 is all loopback on Linux).
func clientFrom(ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: d.DialContext}}
}

// login sends a GET with basic auth from client and returns the status.
func login(t *testing.T, client *http.Client, base, password string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, base+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth("alice", password)
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode
}

// TestBinaryFailedLogins runs the README's brute-force recipe verbatim
// (its port and an admin address aside) on the built binary, on the
// embedded store and on Redis: 20 wrong passwords from one IP get 401 five
// times, then 429; a right password from that IP costs nothing while it
// is not locked out, and is refused once it is; right passwords from
// another IP always pass; the buckets then hold exactly the 5 failures.
func TestBinaryFailedLogins(t *testing.T) {
	recipe := readmeBlock(t, "count_status 401")
	srv := redistest.StartStandalone(t, redistest.Options{})
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			cf := strings.Replace(recipe, "{\n\torder", "{\n\tadmin 127.0.0.1:{ADMIN}\n\tauto_https off\n\torder", 1)
			cf = strings.Replace(cf, ":8080 {", ":{PORT} {", 1)
			if store == "redis" {
				cf = strings.Replace(cf, "rate_limit {\n", "rate_limit {\n\t\tredis "+srv.Addr+"\n", 1)
			}
			if cf == recipe {
				t.Fatal("the recipe was not adapted for the test")
			}
			p := startCaddyProcess(t, cf)
			p.caddyServer.admin = fmt.Sprintf("127.0.0.1:%d", p.admin)
			base := fmt.Sprintf("http://127.0.0.1:%d", p.port)
			a, b := clientFrom("127.0.0.1"), clientFrom("127.0.0.2")

			if got := login(t, b, base, "wonderland"); got != http.StatusOK {
				t.Fatalf("right password from another IP: %d", got)
			}
			// Two failures, a success that costs nothing, three failures.
			for i, want := range []int{401, 401, 200, 401, 401, 401} {
				password := "guess"
				if want == 200 {
					password = "wonderland"
				}
				if got := login(t, a, base, password); got != want {
					t.Fatalf("attempt %d from 127.0.0.1: %d, want %d", i+1, got, want)
				}
			}
			// 20 wrong passwords in all: the other 15 are refused.
			for i := range 15 {
				if got := login(t, a, base, "guess"); got != http.StatusTooManyRequests {
					t.Fatalf("wrong password %d: %d, want 429", 6+i, got)
				}
			}
			if got := login(t, a, base, "wonderland"); got != http.StatusTooManyRequests {
				t.Fatalf("right password from the locked-out IP: %d, want 429", got)
			}
			for i := range 5 {
				if got := login(t, b, base, "wonderland"); got != http.StatusOK {
					t.Fatalf("right password %d from another IP: %d", i+2, got)
				}
			}
			for ip, want := range map[string]float64{"127.0.0.1": 0, "127.0.0.2": 5} {
				m := p.adminOK("GET", "/rate_limit/usage?tenant="+ip+"&policy=failed_logins", "")
				if got := adminPolicy(t, m, "failed_logins")["remaining"]; got != want {
					t.Errorf("%s: remaining %v, want %v", ip, got, want)
				}
			}
		})
	}
}

// TestBinaryRefundFlaky: an upstream that answers 503 to every other
// request, behind `refund_status 5xx`, on the built binary and both
// stores: the tenant is charged for the successful half only, with a
// fixed cost and with a metered one (`cost_after header`, whose failed
// answers report a cost too: not settled, and their up-front cost given
// back).
func TestBinaryRefundFlaky(t *testing.T) {
	var n atomic.Int64
	upstream := newHTTPServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Credits", "5")
		if n.Add(1)%2 == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_, _ = io.WriteString(w, "answer")
	}))
	srv := redistest.StartStandalone(t, redistest.Options{})
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			redisLine := ""
			if store == "redis" {
				redisLine = "redis " + srv.Addr
			}
			p := startCaddyProcess(t, `{
	admin 127.0.0.1:{ADMIN}
	auto_https off
}

http://127.0.0.1:{PORT} {
	rate_limit {
		`+redisLine+`
		tenant {http.request.header.X-Tenant}
		policy requests {
			limit 1000
			window 1h
			refund_status 5xx
		}
		policy credits {
			limit 1000
			window 1h
			cost_after header X-Credits
			refund_status 5xx
		}
	}
	reverse_proxy `+upstream+`
}
`)
			p.caddyServer.admin = fmt.Sprintf("127.0.0.1:%d", p.admin)
			codes := map[int]int{}
			for range 40 {
				codes[p.get("/", "X-Tenant", "acme").status]++
			}
			if codes[200] != 20 || codes[503] != 20 {
				t.Fatalf("answers %v, want 20 of 200 and 20 of 503", codes)
			}
			m := p.adminOK("GET", "/rate_limit/usage?tenant=acme", "")
			if got := adminPolicy(t, m, "requests")["remaining"]; got != 980.0 {
				t.Errorf("requests: remaining %v, want 980 (20 successful requests charged)", got)
			}
			if got := adminPolicy(t, m, "credits")["remaining"]; got != 900.0 {
				t.Errorf("credits: remaining %v, want 900 (20 successful answers of 5 credits)", got)
			}
		})
	}
}
