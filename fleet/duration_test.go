package fleet

import (
	"testing"
	"time"
)

func TestParseDuration(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"90s", 90 * time.Second, true},
		{"1d", 24 * time.Hour, true},
		{"1.5d", 36 * time.Hour, true},
		{"2d12h30m", 60*time.Hour + 30*time.Minute, true},
		{"1h", time.Hour, true},
		{"d", 0, false},
		{"1x", 0, false},
		{"", 0, false},
	} {
		got, err := parseDuration(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parseDuration(%q) = %v, %v; want %v (ok=%v)", tc.in, got, err, tc.want, tc.ok)
		}
	}
}
