package fleet

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// TestMain fails the package when a goroutine outlives the tests (a
// writer, a sync loop or a client left running). The redistest spawner
// thread lives as long as the process by design.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/tollgate/caddy-tollgate/internal/redistest.startCmd.func1.1"))
}

// waitFor polls cond for up to 10 seconds and fails the test if it never
// holds.
func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// entriesAdded is XINFO STREAM's entries-added: every entry ever written,
// trimmed ones included.
func entriesAdded(t testing.TB, c redis.UniversalClient, stream string) int64 {
	t.Helper()
	info, err := c.XInfoStream(context.Background(), stream).Result()
	if err != nil {
		if strings.Contains(err.Error(), "no such key") {
			return 0
		}
		t.Fatal(err)
	}
	return info.EntriesAdded
}

// dropCounter counts DenialsDropped by reason, as an Observer would.
type dropCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (d *dropCounter) add(reason string, n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.n == nil {
		d.n = map[string]int{}
	}
	d.n[reason] += n
}

func (d *dropCounter) get(reason string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n[reason]
}

func (d *dropCounter) total() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	sum := 0
	for _, n := range d.n {
		sum += n
	}
	return sum
}
