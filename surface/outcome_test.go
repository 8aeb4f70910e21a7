package surface

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/tollgate/caddy-tollgate/fleet"
	"github.com/tollgate/caddy-tollgate/gate"
	"github.com/tollgate/caddy-tollgate/internal/caddyreq"
)

// TestStatusOf: the status an outcome is judged by is the chain's error's
// (a HandlerError's code, else 500), else 500 for a chain that panicked,
// else the one written, else 200.
func TestStatusOf(t *testing.T) {
	for _, tc := range []struct {
		written int
		err     error
		want    int
	}{
		{0, nil, 200},
		{503, nil, 503},
		{101, nil, 101},
		{0, caddyhttp.Error(http.StatusUnauthorized, errors.New("bad password")), 401},
		{200, caddyhttp.Error(http.StatusBadGateway, nil), 502},
		{0, errors.New("plain"), 500},
		{0, caddyhttp.HandlerError{}, 500},
	} {
		if got := statusOf(tc.written, tc.err, false); got != tc.want {
			t.Errorf("statusOf(%d, %v) = %d, want %d", tc.written, tc.err, got, tc.want)
		}
	}
	if got := statusOf(200, nil, true); got != 500 {
		t.Errorf("statusOf(200, nil, panicked) = %d, want 500", got)
	}
	if got := statusOf(200, caddyhttp.Error(http.StatusBadGateway, nil), true); got != 502 {
		t.Errorf("statusOf(200, a 502, panicked) = %d, want 502", got)
	}
}

// TestMeteredWriterStatusReset: a pooled metered writer starts each
// response without the previous one's status (an outcome would be judged
// by it), and records an upgrade's 101.
func TestMeteredWriterStatusReset(t *testing.T) {
	var w meteredWriter
	w.reset(httptest.NewRecorder(), nil)
	w.WriteHeader(http.StatusServiceUnavailable)
	if w.status != 503 {
		t.Fatalf("status %d after WriteHeader(503)", w.status)
	}
	w.release()
	w.reset(httptest.NewRecorder(), nil)
	if w.status != 0 {
		t.Fatalf("a reset writer keeps status %d", w.status)
	}
	w.WriteHeader(http.StatusSwitchingProtocols)
	if w.status != 101 {
		t.Fatalf("an upgrade's status is %d, want 101", w.status)
	}
}

// TestAbortedResponseOutcome: a response the chain aborts after writing
// its status (reverse_proxy panics with http.ErrAbortHandler when the
// upstream fails mid-body) is judged as a 500, whether or not its policy
// is metered: refund_status 5xx gives its unit back in both. (A metered
// policy judged it by the 200 written, and kept the unit.)
func TestAbortedResponseOutcome(t *testing.T) {
	for _, meter := range []string{"", `,"cost_after":{"header":"X-Cost"}`} {
		tenant := "unmetered"
		if meter != "" {
			tenant = "metered" // the embedded store is the process's
		}
		h := provisionServer(t, `{"tenant":"{http.request.header.X-Tenant}","rate_limits":{"p":{"algorithm":"token_bucket","max_events":10,"window":60000000000,"refund_status":["5xx"]`+meter+`}}}`)
		abort := caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
			w.Header().Set("X-Cost", "1")
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write([]byte("partial"))
			panic(http.ErrAbortHandler)
		})
		func() {
			defer func() {
				if p := recover(); p != http.ErrAbortHandler {
					t.Errorf("metered %v: the chain's panic %v did not reach the server", meter != "", p)
				}
			}()
			w := httptest.NewRecorder()
			_ = h.ServeHTTP(w, caddyreq.New(w, tenant), abort)
		}()
		w := httptest.NewRecorder()
		if err := h.ServeHTTP(w, caddyreq.New(w, tenant), caddyreq.OK); err != nil {
			t.Fatal(err)
		}
		if got := w.Header().Get("X-Ratelimit-Remaining"); got != "9" {
			t.Errorf("metered %v: remaining %s after an aborted response and one more, want 9 (the aborted one's unit given back)", meter != "", got)
		}
	}
}

// TestHistoryOfSettlement: the usage history counts what a metered
// request was charged: a token bucket gives a lower real cost back, a
// fixed window keeps its up-front units (limiter.Settle). (The history
// took the lower real cost off for both, under-reporting windows.)
func TestHistoryOfSettlement(t *testing.T) {
	for _, tc := range []struct {
		algorithm string
		want      int64
	}{{"token_bucket", 3}, {"fixed_window", 10}} {
		tenant := "history-" + tc.algorithm // the embedded store is the process's
		h := provisionServer(t, `{"tenant":"{http.request.header.X-Tenant}","rate_limits":{"p":{"algorithm":"`+tc.algorithm+`","max_events":1000,"window":3600000000000,"cost":10,"cost_after":{"header":"X-Cost"}}}}`)
		m, err := gate.OpenMemory(gate.MemoryOptions{History: &fleet.HistoryOptions{}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Close() })
		h.gate.Store = m
		answer := caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
			w.Header().Set("X-Cost", "3")
			w.WriteHeader(http.StatusOK)
			return nil
		})
		w := httptest.NewRecorder()
		if err := h.ServeHTTP(w, caddyreq.New(w, tenant), answer); err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		points, err := m.History().Series(context.Background(), "p", tenant, fleet.Minute, now.Add(-time.Minute), now)
		if err != nil {
			t.Fatal(err)
		}
		var admitted int64
		for _, p := range points {
			admitted += p.Admitted
		}
		if admitted != tc.want {
			t.Errorf("%s: history admitted %d units for a request of 10 up front that cost 3, want %d (what it was charged)", tc.algorithm, admitted, tc.want)
		}
	}
}
