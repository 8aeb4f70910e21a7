package limiter

import (
	"crypto/sha256"
	"encoding/hex"
)

// MaxValueLen is the longest tenant or partition value, in raw bytes, kept
// in a key. A longer value is replaced by a digest, so a hostile header
// cannot grow keys (and memory) without bound: a kept value adds at most
// 3 x MaxValueLen bytes to a key (every byte escaped), a digest 66. The
// bound is on the raw value, not its escaped form, so whether a value is
// kept does not depend on how many of its bytes need escaping.
const MaxValueLen = 128

// hashedMarker starts a digest in place of a long value. Escaping always
// writes '%' followed by two hex digits, so "%#" never comes out of
// AppendEscaped for a kept value, and a digest cannot collide with one.
const hashedMarker = "%#"

const upperhex = "0123456789ABCDEF"

// needsEscape reports whether c must be percent-encoded inside a key: the
// hash-tag braces, the key separator, the escape byte itself and every
// control byte.
func needsEscape(c byte) bool {
	return c < 0x20 || c == 0x7f || c == '{' || c == '}' || c == ':' || c == '%'
}

// AppendEscaped appends v to dst in the form used inside bucket keys: bytes
// that could move a Redis hash tag, split a key or corrupt a log line are
// percent-encoded ('%' and two upper-case hex digits), and a value longer
// than MaxValueLen bytes is replaced by "%#" + hex(SHA-256(v)) (66 bytes).
// Distinct values always give distinct output: escaping is invertible,
// never writes "%#", and digests of distinct values differ.
func AppendEscaped(dst []byte, v string) []byte {
	if len(v) > MaxValueLen {
		sum := sha256.Sum256([]byte(v))
		dst = append(dst, hashedMarker...)
		return hex.AppendEncode(dst, sum[:])
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if needsEscape(c) {
			dst = append(dst, '%', upperhex[c>>4], upperhex[c&0xf])
			continue
		}
		dst = append(dst, c)
	}
	return dst
}

// Anonymous is the tenant of requests whose tenant (or, without a tenant
// template, whose key) resolves empty: one bucket per policy, shared by
// all of them, named "_anonymous" wherever a tenant shows (its keys'
// hash tag, placeholders, logs, the admin API). Requests reach it only
// through TenantOf, never by sending its name.
const Anonymous = "_anonymous"

// TenantOf is the engine's tenant of a request whose tenant (or key)
// resolved to v: Anonymous for an empty v, v itself for every other
// value but one. A request sending the literal value "_anonymous" must not
// share the anonymous bucket, so that value becomes the empty tenant,
// which no request has otherwise; its hash tag is literalAnonymousTag, and
// placeholders and logs show it empty. TenantOf is its own inverse:
// TenantOf(tenant) is the value the request sent, as caddy-ratelimit
// names a bucket. Everything that reads a tenant from a request calls it,
// once; the admin API names tenants as the engine does, so
// tenant=_anonymous is the anonymous bucket.
func TenantOf(v string) string {
	switch v {
	case "":
		return Anonymous
	case Anonymous:
		return ""
	}
	return v
}

// literalAnonymousTag is the hash tag of the empty tenant, the requests
// that sent the literal value "_anonymous" (see TenantOf): that value
// with its '_' written %5F. AppendEscaped writes '%' only before the
// upper-case hex of a byte it must escape (a control byte, '{', '}', ':'
// or '%', never '_') or before the digest's '#', so no other tenant has
// this tag. It is not empty: an empty tag would make Redis Cluster hash
// each whole key, scattering one request's keys over slots.
const literalAnonymousTag = "%5Fanonymous"

// AppendTenantTag appends the hash-tag text of tenant to dst: its escaped
// form (Anonymous is "_anonymous"), or literalAnonymousTag for the empty
// tenant. Every key that carries a tenant writes it through here.
func AppendTenantTag(dst []byte, tenant string) []byte {
	if tenant == "" {
		return append(dst, literalAnonymousTag...)
	}
	return AppendEscaped(dst, tenant)
}

// AppendKey appends a bucket key to dst:
//
//	<prefix>:<algo>:{<tenant>}:<policy>[:<part>]
//
// tenant is written by AppendTenantTag, part by AppendEscaped; prefix and policy are
// configuration names validated to contain no separator or brace. The
// {tenant} hash tag keeps every key of a tenant in one Redis Cluster slot.
func AppendKey(dst []byte, prefix string, algo Algorithm, tenant, policy, part string) []byte {
	return appendTenantKey(dst, prefix, algo.String(), tenant, policy, part)
}

// appendTenantKey appends <prefix>:<segment>:{<tenant>}:<name>[:<part>]
// to dst: the layout of every key of a tenant (a bucket's, with its
// algorithm as segment; a held index's; a once key's, its id as name),
// all in the tenant's Cluster slot. name is written as it is; part, when
// not empty, by AppendEscaped.
func appendTenantKey(dst []byte, prefix, segment, tenant, name, part string) []byte {
	dst = append(dst, prefix...)
	dst = append(dst, ':')
	dst = append(dst, segment...)
	dst = append(dst, ':', '{')
	dst = AppendTenantTag(dst, tenant)
	dst = append(dst, '}', ':')
	dst = append(dst, name...)
	if part != "" {
		dst = append(dst, ':')
		dst = AppendEscaped(dst, part)
	}
	return dst
}

// ValidName reports whether s may be used as a policy name or key prefix:
// non-empty, at most 64 bytes of letters, digits, '_', '-' and '.'. Such
// names cannot contain a key separator or a hash-tag brace.
func ValidName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '-', c == '.':
		default:
			return false
		}
	}
	return true
}

// keySlot returns the Redis Cluster hash slot of key: CRC16 (XMODEM) of the
// hash tag (the bytes between the first '{' and the next '}', when not
// empty) or of the whole key, modulo 16384.
func keySlot(key []byte) uint16 {
	for i, c := range key {
		if c != '{' {
			continue
		}
		for j := i + 1; j < len(key); j++ {
			if key[j] == '}' {
				if j > i+1 {
					key = key[i+1 : j]
				}
				break
			}
		}
		break
	}
	var crc uint16
	for _, c := range key {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^c]
	}
	return crc & 16383
}

// crc16Table is the table of CRC-16/XMODEM (polynomial 0x1021).
var crc16Table = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()
