package gate

import (
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/tollgate/caddy-tollgate/config"
	"github.com/tollgate/caddy-tollgate/fleet"
)

// BackendOptions is rc as the shared backend's options: placeholders
// such as {env.REDIS_PASSWORD} resolved in the fields where secrets and deployment details live, and applies the
// defaults: what identifies the shared fleet.Backend.
func BackendOptions(rc *config.RedisConfig, logger *zap.Logger) fleet.BackendOptions {
	repl := caddy.NewReplacer()
	c := fleet.Connection{
		Cluster:        rc.Cluster,
		SentinelMaster: repl.ReplaceKnown(rc.SentinelMaster, ""),
		Username:       repl.ReplaceKnown(rc.Username, ""),
		Password:       repl.ReplaceKnown(rc.Password, ""),
		DB:             rc.DB,
		PoolSize:       rc.PoolSize,
		Timeout:        time.Duration(rc.Timeout),
	}
	for _, a := range rc.Addresses {
		c.Addresses = append(c.Addresses, repl.ReplaceKnown(a, ""))
	}
	if t := rc.TLS; t != nil {
		c.TLS = &fleet.TLS{
			InsecureSkipVerify: t.InsecureSkipVerify,
			CA:                 repl.ReplaceKnown(t.CA, ""),
			Cert:               repl.ReplaceKnown(t.Cert, ""),
			Key:                repl.ReplaceKnown(t.Key, ""),
			ServerName:         repl.ReplaceKnown(t.ServerName, ""),
		}
	}
	return fleet.BackendOptions{
		Connection:      c,
		Prefix:          rc.KeyPrefix,
		BreakerFailures: rc.BreakerFailures,
		BreakerCooldown: time.Duration(rc.BreakerCooldown),
		Functions:       rc.Functions == nil || *rc.Functions,
		Logger:          logger,
	}
}
