package surface

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// TestStatusOf: the status an outcome is judged by is the chain's error's
// (a HandlerError's code, else 500), else the one written, else 200.
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
		if got := statusOf(tc.written, tc.err); got != tc.want {
			t.Errorf("statusOf(%d, %v) = %d, want %d", tc.written, tc.err, got, tc.want)
		}
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
