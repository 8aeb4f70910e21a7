package config

import (
	"time"

	"github.com/caddyserver/caddy/v2"
)

// HistoryConfig is the usage history a handler keeps: per tenant and
// policy, the units admitted, the requests denied and the shadow
// would-denies, by minute and by hour. With Redis the whole fleet writes
// one history; on the embedded store it is the process's. The
// rate_limit_usage handler and the admin API read it.
type HistoryConfig struct {
	// Keep no history.
	Off bool `json:"off,omitempty"`

	// How long minute points are kept: 1h to 31d. Default 48h.
	Minutes caddy.Duration `json:"minutes,omitempty"`

	// How long hour points are kept: 1d to 1830d (5 years), at least
	// as long as minutes. Default 90d.
	Hours caddy.Duration `json:"hours,omitempty"`
}

// historyForm is the Caddyfile form of history.
const historyForm = "history off | history <minute_retention> <hour_retention>"

// parseHistory reads `history off` or `history <minutes> <hours>`.
func parseHistory(p cfParser, h *Handler) error {
	args, err := p.args(1, 2)
	if err != nil {
		return err
	}
	if len(args) == 1 {
		if args[0] != "off" {
			return p.dirErr("%q: want off, or two retentions (e.g. history 48h 90d)", args[0])
		}
		h.History = &HistoryConfig{Off: true}
		return nil
	}
	hc := new(HistoryConfig)
	if hc.Minutes, err = p.parseDuration(args[0]); err != nil {
		return err
	}
	if hc.Hours, err = p.parseDuration(args[1]); err != nil {
		return err
	}
	h.History = hc
	return nil
}

// checkHistory checks the history at path.
func checkHistory(path []string, hc *HistoryConfig) error {
	if hc == nil || hc.Off {
		return nil
	}
	if m := time.Duration(hc.Minutes); m != 0 && (m < time.Hour || m > 31*24*time.Hour) {
		return at(sub(path, "minutes"), "%s: want 1h to 31d", m)
	}
	if d := time.Duration(hc.Hours); d != 0 && (d < 24*time.Hour || d > 1830*24*time.Hour) {
		return at(sub(path, "hours"), "%s: want 1d to 1830d", d)
	}
	if hc.Minutes != 0 && hc.Hours != 0 && hc.Hours < hc.Minutes {
		return at(sub(path, "hours"), "%s: want at least minutes (%s)", time.Duration(hc.Hours), time.Duration(hc.Minutes))
	}
	return nil
}

// Retentions are the history's retentions, 0 for the defaults; ok is
// false when the handler keeps no history.
func (hc *HistoryConfig) Retentions() (minutes, hours time.Duration, ok bool) {
	if hc == nil {
		return 0, 0, true
	}
	return time.Duration(hc.Minutes), time.Duration(hc.Hours), !hc.Off
}
