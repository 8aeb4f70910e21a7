package config

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/tollgate/caddy-tollgate/limiter"
)

// InternalName is the engine's name of the zone or policy configured as
// name: the name itself when it is a valid policy name, else "zone-", up
// to 32 bytes of the name with every byte a policy name cannot hold
// replaced by '_', a '.', and 24 hex digits of SHA-256(name). Distinct
// odd names get distinct internal names (96 bits of digest); an internal
// name could only equal a configured valid name if that name were written
// out digest and all, and two handlers sharing a name share its buckets
// anyway (policies are named buckets), which warnSharedPolicies reports.
func InternalName(name string) string {
	if limiter.ValidName(name) {
		return name
	}
	var b strings.Builder
	b.WriteString(internalPrefix)
	for i := 0; i < len(name) && i < 32; i++ {
		c := name[i]
		if limiter.ValidName(string(c)) {
			b.WriteByte(c)
		} else {
			b.WriteByte('_')
		}
	}
	sum := sha256.Sum256([]byte(name))
	b.WriteByte('.')
	b.WriteString(hex.EncodeToString(sum[:12]))
	return b.String()
}

// MetricLabel is a policy name as a Prometheus label value: valid UTF-8
// (the client library refuses anything else).
func MetricLabel(name string) string {
	if utf8.ValidString(name) {
		return name
	}
	return strings.ToValidUTF8(name, "\uFFFD")
}

// HeaderName is a policy name as the inside of a structured-field string
// (RFC 9651), for RateLimit-Policy and RateLimit: printable ASCII, with
// '"' and '\' escaped; any other byte is percent-encoded, as is '%'. Valid
// policy names come out unchanged.
func HeaderName(name string) string {
	clean := true
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '%' {
			clean = false
			break
		}
	}
	if clean {
		return name
	}
	const hexDigits = "0123456789ABCDEF"
	b := make([]byte, 0, len(name)+8)
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c > 0x7e || c == '%':
			b = append(b, '%', hexDigits[c>>4], hexDigits[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return string(b)
}

// HeaderMode selects which rate-limit response headers are written.
type HeaderMode uint8

func ParseHeaderMode(s string) (HeaderMode, error) {
	switch s {
	case "", "both":
		return HeadersBoth, nil
	case "ietf":
		return HeadersIETF, nil
	case "legacy":
		return HeadersLegacy, nil
	case "off":
		return HeadersOff, nil
	}
	return 0, fmt.Errorf("headers: unknown value %q (allowed: both, ietf, legacy, off)", s)
}

const (
	HeadersBoth HeaderMode = iota
	HeadersIETF
	HeadersLegacy
	HeadersOff
)

// MissingTenantDeny is the missing_tenant value that answers 429.
const MissingTenantDeny = "deny"

// internalPrefix starts the internal name of a zone whose name is not a
// valid policy name.
const internalPrefix = "zone-"
