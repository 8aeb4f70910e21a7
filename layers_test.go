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

// TestLayerImports: imports only go down (root → fleet → limiter → lua).
// The engine and fleet know nothing of Caddy or Prometheus.
func TestLayerImports(t *testing.T) {
	const mod = "github.com/tollgate/caddy-tollgate"
	forbidden := map[string][]string{
		"lua":     {mod, "github.com/caddyserver/", "github.com/prometheus/", "github.com/redis/"},
		"limiter": {mod + "/fleet", mod + "/internal/topk", "github.com/caddyserver/", "github.com/prometheus/", "go.uber.org/zap"},
		"fleet":   {"github.com/caddyserver/", "github.com/prometheus/", mod + "/internal/topk"},
	}
	// The root package may import every layer; a layer must not import
	// the root package either.
	for dir, bad := range forbidden {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: %v", dir, err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			parsed, err := parser.ParseFile(token.NewFileSet(), f, src, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range parsed.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				if path == mod {
					t.Errorf("%s imports the root package", f)
				}
				for _, b := range bad {
					if strings.HasPrefix(path, b) && !(dir == "limiter" && strings.HasPrefix(path, mod+"/lua")) {
						t.Errorf("%s imports %s: %s must not", f, path, dir)
					}
				}
			}
		}
	}
}
