package tollgate

import (
	"slices"
	"sync"
)

// The handler registry: the admin API (admin.go) finds the rate_limit
// handlers of the running config here.

// handlers is every provisioned rate_limit handler, in provisioning order.
// During a reload the old and the new config's handlers are both present
// until the old ones are cleaned up.
var (
	handlersMu sync.RWMutex
	handlers   []*Handler
)

func registerHandler(h *Handler) {
	handlersMu.Lock()
	defer handlersMu.Unlock()
	handlers = append(handlers, h)
}

func unregisterHandler(h *Handler) {
	handlersMu.Lock()
	defer handlersMu.Unlock()
	if i := slices.Index(handlers, h); i >= 0 {
		handlers = slices.Delete(handlers, i, i+1)
	}
}

// liveHandlers returns the registered handlers; call it under
// handlersMu.RLock (the routes do, see locked).
func liveHandlers() []*Handler {
	return handlers
}
