package tollgate

import (
	"os"
	"path/filepath"
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
			for _, dir := range sourceDirs(t) {
				if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
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

// sourceDirs lists the repository's directories (not testdata, not
// hidden ones), where a file named without its directory may live.
func sourceDirs(t *testing.T) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		if path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		dirs = append(dirs, path)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}

// TestDocLinks: every relative link of the README, the docs and
// ARCHITECTURE.md reaches a file, and every #anchor a heading of it.
func TestDocLinks(t *testing.T) {
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	heading := regexp.MustCompile(`(?m)^#+ (.+)$`)
	anchorOf := func(h string) string {
		h = strings.ToLower(strings.TrimSpace(h))
		var b strings.Builder
		for _, r := range h {
			switch {
			case r == ' ' || r == '-':
				b.WriteRune('-')
			case r == '_' || (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9'):
				b.WriteRune(r)
			}
		}
		return b.String()
	}
	docs := append(docFiles(t), "ARCHITECTURE.md", "CHANGELOG.md")
	for _, doc := range docs {
		src, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(src), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			path := doc
			if file != "" {
				path = filepath.Join(filepath.Dir(doc), file)
			}
			b, err := os.ReadFile(path)
			if err != nil {
				if _, serr := os.Stat(path); serr != nil {
					t.Errorf("%s links %s: %v", doc, target, serr)
				}
				continue
			}
			if anchor == "" {
				continue
			}
			found := false
			for _, h := range heading.FindAllStringSubmatch(string(b), -1) {
				if anchorOf(h[1]) == anchor {
					found = true
					break
				}
			}
			if !found {
				t.Errorf("%s links %s: no heading %q in %s", doc, target, anchor, path)
			}
		}
	}
}
