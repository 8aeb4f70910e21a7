package tollgate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"

	"github.com/tollgate/caddy-tollgate/internal/redistest"
)

// TestE2ELongValuesDigestedByRawLength: with a real Redis, a tenant or key
// of up to 128 bytes is kept in the bucket key, escaped however long its
// escaped form is; 129 bytes are replaced by "%#" and the SHA-256 digest,
// with or without bytes that need escaping. Each value is its own bucket.
func TestE2ELongValuesDigestedByRawLength(t *testing.T) {
	srv := redistest.StartStandalone(t, redistest.Options{})
	s := startCaddy(t, "", fmt.Sprintf(`
	route /tenant {
		rate_limit {
			redis {
				address %[1]s
			}
			tenant {http.request.header.X-V}
			policy lv_tenant {
				limit 1
				window 1h
			}
		}
		respond "ok"
	}
	route /part {
		rate_limit {
			redis {
				address %[1]s
			}
			tenant {http.request.header.X-T}
			policy lv_part {
				key {http.request.header.X-V}
				limit 1
				window 1h
			}
		}
		respond "ok"
	}`, srv.Addr), nil)
	digest := func(v string) string {
		sum := sha256.Sum256([]byte(v))
		return "%#" + hex.EncodeToString(sum[:])
	}
	x128, x129 := strings.Repeat("x", 128), strings.Repeat("x", 129)
	braces128 := strings.Repeat("{:", 64)
	for _, tc := range []struct{ value, inKey string }{
		{x128, x128},
		{x129, digest(x129)},
		{braces128, strings.Repeat("%7B%3A", 64)},
		{braces128 + "x", digest(braces128 + "x")},
		{strings.Repeat("x", 127) + "%", strings.Repeat("x", 127) + "%25"},
		{strings.Repeat("x", 127) + "}%", digest(strings.Repeat("x", 127) + "}%")},
	} {
		for _, route := range []struct{ path, key string }{
			{"/tenant", "rl:sliding_window:{" + tc.inKey + "}:lv_tenant"},
			{"/part", "rl:sliding_window:{t}:lv_part:" + tc.inKey},
		} {
			if c := s.statuses(2, route.path, "X-V", tc.value, "X-T", "t"); c[200] != 1 || c[429] != 1 {
				t.Errorf("%s, %d-byte value %.20q...: %v, want 1 x 200 and 1 x 429 (a bucket of its own)", route.path, len(tc.value), tc.value, c)
			}
			n, err := srv.Client(t).Exists(context.Background(), route.key).Result()
			if err != nil {
				t.Fatal(err)
			}
			if n != 1 {
				t.Errorf("%s, %d-byte value %.20q...: no key %.60q... (%d bytes) in Redis", route.path, len(tc.value), tc.value, route.key, len(route.key))
			}
		}
	}
	// Nothing else was written: one key per value and route.
	keys, err := srv.Client(t).Keys(context.Background(), "rl:sliding_window:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 12 {
		t.Errorf("%d bucket keys, want 12", len(keys))
	}
}
