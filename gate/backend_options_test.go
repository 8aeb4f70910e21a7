package gate

import (
	"testing"

	"go.uber.org/zap"

	"github.com/tollgate/caddy-tollgate/config"
)

// TestRedisFunctionsDefault: the scripts run as a function library unless
// functions is off.
func TestRedisFunctionsDefault(t *testing.T) {
	on, off := true, false
	for _, tc := range []struct {
		set  *bool
		want bool
	}{{nil, true}, {&on, true}, {&off, false}} {
		rc := &config.RedisConfig{Addresses: []string{"a:1"}, Functions: tc.set}
		if got := BackendOptions(rc, zap.NewNop()).Functions; got != tc.want {
			t.Errorf("functions %v: backend Functions %v, want %v", tc.set, got, tc.want)
		}
	}
}
