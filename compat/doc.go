// Package compat is what makes Tollgate a drop-in for mholt/caddy-ratelimit
// beyond its Caddyfile (package config): its `distributed` mode, how a
// denied request charges zones (ChargeZones), and its metric families.
package compat
