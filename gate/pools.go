package gate

import (
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/tollgate/caddy-tollgate/fleet"
	"github.com/tollgate/caddy-tollgate/limiter"
)

// embeddedStores holds the process-wide embedded stores. Like a Redis
// server, one store is shared by every handler and outlives config
// reloads, so counters survive a reload; it is closed when the last handler
// using it is cleaned up. Stores are keyed by sweep interval and memory
// budget, the settings a handler can give them.
var embeddedStores = caddy.NewUsagePool()

type embeddedStore struct{ *limiter.MemoryStore }

// Destruct implements caddy.Destructor.
func (s embeddedStore) Destruct() error { return s.Close() }

func embeddedStoreKey(sweep time.Duration, maxMemory int64) string {
	if maxMemory <= 0 {
		maxMemory = limiter.DefaultMaxMemory
	}
	return "memory/sweep=" + sweep.String() + "/max_memory=" + strconv.FormatInt(maxMemory, 10)
}

// loadEmbeddedStore returns the shared embedded store for sweep and
// maxMemory (0: the default), creating it on first use. Release it with
// embeddedStores.Delete(key).
func loadEmbeddedStore(sweep time.Duration, maxMemory int64) (limiter.Store, string, error) {
	key := embeddedStoreKey(sweep, maxMemory)
	v, _, err := embeddedStores.LoadOrNew(key, func() (caddy.Destructor, error) {
		return embeddedStore{limiter.NewMemoryStore(limiter.MemoryOptions{SweepInterval: sweep, MaxMemory: maxMemory})}, nil
	})
	if err != nil {
		return nil, "", err
	}
	return v.(embeddedStore).MemoryStore, key, nil
}

// fallbackStoreKey names the process-wide store of fail_mode local
// policies. It is separate from the embedded stores so fallback buckets
// never mix with real ones.
const fallbackStoreKey = "memory/fallback"

// loadFallbackStore returns the shared fallback store. Release it with
// embeddedStores.Delete(key).
func loadFallbackStore() (limiter.Store, string, error) {
	v, _, err := embeddedStores.LoadOrNew(fallbackStoreKey, func() (caddy.Destructor, error) {
		return embeddedStore{limiter.NewMemoryStore(limiter.MemoryOptions{Prefix: "fallback"})}, nil
	})
	if err != nil {
		return nil, "", err
	}
	return v.(embeddedStore).MemoryStore, fallbackStoreKey, nil
}

// memoryOverrides holds the runtime overrides of handlers on the embedded
// store: process-wide, lost on restart.
var memoryOverrides = fleet.NewOverrideTable()

// memoryNearLimit is the near-limit board of handlers on the embedded
// store: process-wide, so it survives config reloads (as the embedded
// store does).
var memoryNearLimit = fleet.NewNearLimitBoard()

// memoryPenalties holds the penalty boxes of handlers on the embedded
// store: process-wide, so boxes survive config reloads; lost on restart.
var memoryPenalties = &limiter.LocalPenalties{PenaltyTable: limiter.NewPenaltyTable(0)}

// embeddedFired is the webhook events handlers on the embedded store
// fired: process-wide, so a config reload does not send again what the
// config before it sent this period (with Redis, the fleet's markers say
// so); lost on restart.
var embeddedFired = fleet.NewOnceTable()
