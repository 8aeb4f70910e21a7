package tollgate

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestDockerfilePinsGoModVersions: the Dockerfile builds the Caddy version
// go.mod requires and this module's path (Docker cannot run here; this is
// what can drift).
func TestDockerfilePinsGoModVersions(t *testing.T) {
	mod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	docker, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*github\.com/caddyserver/caddy/v2 v(\S+)$`).FindSubmatch(mod)
	if m == nil {
		t.Fatal("no caddy requirement in go.mod")
	}
	path := regexp.MustCompile(`(?m)^module (\S+)$`).FindSubmatch(mod)
	for _, want := range []string{
		"ARG CADDY_VERSION=" + string(m[1]),
		"FROM caddy:${CADDY_VERSION}-builder AS builder",
		"--with " + string(path[1]) + "=/src/tollgate",
		"--with \"" + string(path[1]) + "@${TOLLGATE_VERSION}\"",
		"COPY --from=builder /usr/bin/caddy /usr/bin/caddy",
	} {
		if !strings.Contains(string(docker), want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
}

// TestDocsNameRealFiles: every source file ARCHITECTURE.md and the docs
// name exists, so the map cannot drift from the layout.
func TestDocsNameRealFiles(t *testing.T) {
	fileRef := regexp.MustCompile("`((?:[a-z_]+/)*[a-z_]+\\.(?:go|lua|sh|json|yml))`")
	docs := append(docFiles(t), "ARCHITECTURE.md")
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range fileRef.FindAllStringSubmatch(string(b), -1) {
			name := m[1]
			if _, err := os.Stat(name); err == nil {
				continue
			}
			found := false
			for _, dir := range []string{"limiter", "fleet", "lua", "internal/topk", "internal/redistest", "scripts", "bench", "dashboards", "cmd/caddy"} {
				if _, err := os.Stat(dir + "/" + name); err == nil {
					found = true
					break
				}
			}
			if !found {
				t.Errorf("%s names %s, which does not exist", doc, name)
			}
		}
	}
}
