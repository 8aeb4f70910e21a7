package report

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/tollgate/caddy-tollgate/fleet"
	"github.com/tollgate/caddy-tollgate/gate"
)

// Series is a tenant's usage of one policy over a range: one point per
// minute or hour, oldest first, zeros included.
type Series struct {
	// Resolution is "1m" or "1h"; From and To bound the points (RFC 3339,
	// the start of the first and last point).
	Resolution string  `json:"resolution"`
	From       string  `json:"from"`
	To         string  `json:"to"`
	Points     []Point `json:"points"`
}

// Point is what the tenant did in one minute or hour.
type Point struct {
	At string `json:"at"`
	// Admitted is the units admitted, Denied the requests denied,
	// Shadow the requests a shadow limit would have denied.
	Admitted int64 `json:"admitted"`
	Denied   int64 `json:"denied"`
	Shadow   int64 `json:"shadow"`
}

// Range is a history query: the last Length, at Resolution.
type Range struct {
	Length     time.Duration
	Resolution fleet.Resolution
}

// DefaultRange is the range of a query that gives none: the last hour,
// by minute.
var DefaultRange = Range{Length: time.Hour, Resolution: fleet.Minute}

// ErrBadRange is a range or resolution that cannot be read; its message
// names the parameter and what is allowed.
var ErrBadRange = errors.New("bad range")

// ParseRange reads a range ("90m", "48h", "30d"; "" for DefaultRange) and
// a resolution ("1m", "1h"; "" picks minutes for ranges within the
// minute retention of h, else hours).
func ParseRange(h *fleet.History, rng, res string) (Range, error) {
	r := DefaultRange
	if rng != "" {
		d, err := caddy.ParseDuration(rng)
		if err != nil || d <= 0 {
			return r, fmt.Errorf("%w: range: %q is not a positive duration (e.g. 1h, 48h, 30d)", ErrBadRange, rng)
		}
		r.Length = d
		if d > h.Retention(fleet.Minute) {
			r.Resolution = fleet.Hour
		}
	}
	switch res {
	case "":
	case "1m":
		r.Resolution = fleet.Minute
	case "1h":
		r.Resolution = fleet.Hour
	default:
		return r, fmt.Errorf("%w: resolution: %q (allowed: 1m, 1h)", ErrBadRange, res)
	}
	if keep := h.Retention(r.Resolution); r.Length > keep {
		return r, fmt.Errorf("%w: range: %s is longer than the %s points are kept (%s)", ErrBadRange, r.Length, resolutionName(r.Resolution), keep)
	}
	return r, nil
}

func resolutionName(r fleet.Resolution) string {
	if r == fleet.Hour {
		return "1h"
	}
	return "1m"
}

// History is tenant's series of p over r, ending now; nil when the
// handler keeps no history.
func History(ctx context.Context, g *gate.Gate, p *gate.Policy, tenant string, r Range, now time.Time) (*Series, error) {
	h := g.Store.History()
	if h == nil {
		return nil, nil
	}
	step := time.Duration(r.Resolution)
	to := now.Truncate(step)
	from := to.Add(-r.Length + step)
	points, err := h.Series(ctx, p.Engine.Name, tenant, r.Resolution, from, to)
	if err != nil {
		return nil, err
	}
	s := &Series{Resolution: resolutionName(r.Resolution), From: from.UTC().Format(time.RFC3339), To: to.UTC().Format(time.RFC3339),
		Points: make([]Point, len(points))}
	for i, pt := range points {
		s.Points[i] = Point{At: pt.At.Format(time.RFC3339), Admitted: pt.Admitted, Denied: pt.Denied, Shadow: pt.Shadow}
	}
	return s, nil
}
