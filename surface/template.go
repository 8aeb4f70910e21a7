package surface

import (
	"net/http"
	"net/textproto"
	"strings"

	"github.com/caddyserver/caddy/v2"
)

// template is a placeholder template (tenant, tier, key, cost) compiled
// once, at Provision, for the request path: most are a single placeholder,
// often a request header, and resolving those directly spares Caddy's
// replacer its parsing and allocations.
type template struct {
	raw string
	// kind says how to expand: the raw string as is, one request header,
	// one placeholder, or the replacer on the whole string.
	kind templateKind
	// name is the canonical header name, or the placeholder's name.
	name string
}

type templateKind uint8

const (
	templateLiteral templateKind = iota
	templateHeader
	templatePlaceholder
	templateReplacer
)

const requestHeaderPrefix = "http.request.header."

// compileTemplate compiles s.
func compileTemplate(s string) template {
	t := template{raw: s, kind: templateReplacer}
	switch {
	case strings.IndexByte(s, '{') < 0:
		t.kind = templateLiteral
	case len(s) > 2 && s[0] == '{' && s[len(s)-1] == '}' && !strings.ContainsAny(s[1:len(s)-1], "{}\\"):
		name := s[1 : len(s)-1]
		if field, ok := strings.CutPrefix(name, requestHeaderPrefix); ok && field != "" {
			t.kind, t.name = templateHeader, textproto.CanonicalMIMEHeaderKey(field)
		} else {
			t.kind, t.name = templatePlaceholder, name
		}
	}
	return t
}

// expand resolves t for the request r, as repl.ReplaceAll(t.raw, "")
// would: a header's values joined with ",", an unknown placeholder empty.
func (t *template) expand(repl *caddy.Replacer, r *http.Request) string {
	switch t.kind {
	case templateLiteral:
		return t.raw
	case templateHeader:
		switch vals := r.Header[t.name]; len(vals) {
		case 0:
			return ""
		case 1:
			return vals[0]
		default:
			return strings.Join(vals, ",")
		}
	case templatePlaceholder:
		v, _ := repl.GetString(t.name)
		return v
	}
	return repl.ReplaceAll(t.raw, "")
}
