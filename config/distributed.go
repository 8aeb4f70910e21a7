package config

import "github.com/caddyserver/caddy/v2"

// DistributedConfig is caddy-ratelimit's `distributed` block: share zone
// usage through Caddy's storage (or the handler's `storage`). Ignored, with
// a warning, when the handler has a `redis` block.
type DistributedConfig struct {
	// How often to write this instance's usage to storage. Default 5s.
	WriteInterval caddy.Duration `json:"write_interval,omitempty"`

	// How often to read the other instances' usage. Default 5s.
	ReadInterval caddy.Duration `json:"read_interval,omitempty"`

	// Delete another instance's state once it is this old (an instance
	// that stopped). Default: never.
	PurgeAge caddy.Duration `json:"purge_age,omitempty"`
}
