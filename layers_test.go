package tollgate

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// layers is the order of the packages, top first: a package imports only
// packages of a later layer (and internal helpers). Two packages of one
// layer do not import each other.
var layers = [][]string{
	{"."},
	{"surface", "admin", "portal"},
	{"compat", "report"},
	{"gate"},
	{"config", "metrics"},
	{"fleet"},
	{"limiter", "protect"},
	{"lua"},
}

// outside are packages outside the layers: what they may import of the
// module (helpers below everything, and the binaries above it).
var outside = map[string][]string{
	"internal/topk":        nil,
	"internal/usage":       nil,
	"internal/llm":         {"internal/usage"},
	"internal/redistest":   nil,
	"internal/caddyreq":    nil,
	"internal/manualclock": nil,
	"cmd/caddy":            {"."},
	"bench/luasrc":         {"lua"},
	"bench/libdiff":        nil,
	"bench/protectload":    nil,
	// bench/peers is a module of its own: the peers bench/run.sh measures
	// Tollgate against, not part of the product.
	"bench/peers/redisrate":  nil,
	"bench/peers/redisfloor": nil,
	"bench/peers/cmd/caddy":  {"bench/peers/redisrate", "bench/peers/redisfloor"},
}

// forbiddenLibraries are what the engine and the fleet layer must not
// know: they are usable without Caddy, and report through hooks.
var forbiddenLibraries = map[string][]string{
	"lua":     {"github.com/caddyserver/", "github.com/prometheus/", "github.com/redis/"},
	"limiter": {"github.com/caddyserver/", "github.com/prometheus/", "go.uber.org/zap"},
	"fleet":   {"github.com/caddyserver/", "github.com/prometheus/"},
}

// TestLayerImports: imports only go down the layers; the engine and fleet
// know nothing of Caddy or Prometheus; every package of the module is in
// a layer or listed outside them.
func TestLayerImports(t *testing.T) {
	const mod = "github.com/tollgate/caddy-tollgate"
	layerOf := map[string]int{}
	for i, l := range layers {
		for _, p := range l {
			layerOf[p] = i
		}
	}
	dirs := map[string]bool{}
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		dir := filepath.Dir(path)
		dirs[dir] = true
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		parsed, err := parser.ParseFile(token.NewFileSet(), path, src, parser.ImportsOnly)
		if err != nil {
			return err
		}
		from, inLayer := layerOf[dir]
		allowed, isOutside := outside[dir]
		if !inLayer && !isOutside {
			t.Errorf("%s: package %s is in no layer (layers_test.go)", path, dir)
		}
		for _, imp := range parsed.Imports {
			ip, _ := strconv.Unquote(imp.Path.Value)
			for _, b := range forbiddenLibraries[dir] {
				if strings.HasPrefix(ip, b) {
					t.Errorf("%s imports %s: %s must not", path, ip, dir)
				}
			}
			if ip != mod && !strings.HasPrefix(ip, mod+"/") {
				continue
			}
			to := strings.TrimPrefix(strings.TrimPrefix(ip, mod), "/")
			if to == "" {
				to = "."
			}
			if strings.HasPrefix(to, "internal/") {
				continue
			}
			switch {
			case isOutside:
				if !contains(allowed, to) {
					t.Errorf("%s imports %s: %s may import only %v of the module", path, ip, dir, allowed)
				}
			case layerOf[to] <= from:
				t.Errorf("%s imports %s: imports go down the layers only (%s is layer %d, %s layer %d)", path, ip, dir, from, to, layerOf[to])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for dir := range layerOf {
		if !dirs[dir] {
			t.Errorf("layer package %s has no source file", dir)
		}
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
