package gate

import (
	"strconv"

	"github.com/tollgate/caddy-tollgate/limiter"
)

// maxLoggedValue bounds tenant and key values in log lines and event
// data, so a hostile header cannot blow up the logs.
const maxLoggedValue = 128

// Loggable bounds a client-controlled value for logs: at most
// maxLoggedValue bytes, with the original length noted when cut. The JSON
// and console encoders escape control bytes themselves.
func Loggable(s string) string {
	if len(s) <= maxLoggedValue {
		return s
	}
	return s[:maxLoggedValue] + "...(" + strconv.Itoa(len(s)) + " bytes)"
}

// DenialTenant is how the denial stream records tenant (the engine's):
// the tenant field, cut as in logs (Loggable), and, when that cut it, id,
// the tenant's digest (limiter.BoundedValue), which tells apart two
// tenants whose first 128 bytes are the same. Readers match an entry by
// id when there is one, else by the field (fleet.DenialStream.Recent).
func DenialTenant(tenant string) (field, id string) {
	field = Loggable(tenant)
	if field != tenant {
		id = limiter.BoundedValue(tenant)
	}
	return field, id
}
