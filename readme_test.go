package tollgate

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

var caddyfileBlock = regexp.MustCompile("(?s)```caddyfile\n(.*?)```")

// TestReadmeExamplesAdapt: every Caddyfile example in the README and the
// docs adapts and provisions, so the docs cannot drift from the parser.
func TestReadmeExamplesAdapt(t *testing.T) {
	// The notify examples take their secret from the environment.
	t.Setenv("TOLLGATE_WEBHOOK_SECRET", "whsec-docs")
	blocks := docCaddyfileBlocks(t)
	if len(blocks) < 8 {
		t.Fatalf("found %d caddyfile examples in the docs, want at least 8", len(blocks))
	}
	for i, src := range blocks {
		orig := src
		if strings.HasPrefix(strings.TrimSpace(src), "rate_limit") {
			src = ":8080 {\n" + src + "\n}\n"
		}
		cfg := adaptCaddyfile(t, src)
		if !strings.Contains(string(cfg), `"handler":"rate_limit"`) {
			t.Errorf("doc example %d adapts without a rate_limit handler:\n%s", i+1, orig)
		}
		if err := validateConfig(cfg); err != nil {
			t.Errorf("config does not provision: %v", err)
		}
	}
}

// TestCaddyfileExampleAdapts: Caddyfile.example adapts with the default
// environment (the binary test runs it).
func TestCaddyfileExampleAdapts(t *testing.T) {
	src, err := os.ReadFile("Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	cfg := adaptCaddyfile(t, string(src))
	if !strings.Contains(string(cfg), `"handler":"rate_limit"`) {
		t.Error("Caddyfile.example has no rate_limit handler")
	}
	if err := validateConfig(cfg); err != nil {
		t.Errorf("config does not provision: %v", err)
	}
}

// TestReadmeInstallCommands: the Install section gives, as commands of a
// sh block, the plain xcaddy build that fetches the module, the build
// from a checkout, and names the pinned @<version> form.
func TestReadmeInstallCommands(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, install, ok := strings.Cut(string(b), "\n## Install\n")
	if !ok {
		t.Fatal("README has no ## Install section")
	}
	install, _, _ = strings.Cut(install, "\n## ")
	var commands []string
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(install, -1) {
		for l := range strings.SplitSeq(m[1], "\n") {
			commands = append(commands, strings.TrimSpace(l))
		}
	}
	for _, want := range []string{
		"xcaddy build --with github.com/tollgate/caddy-tollgate",
		`xcaddy build v2.11.9 --with "github.com/tollgate/caddy-tollgate=$(pwd)"`,
	} {
		if !slices.Contains(commands, want) {
			t.Errorf("the Install section has no command line %q; its sh lines: %q", want, commands)
		}
	}
	if !strings.Contains(strings.Join(strings.Fields(install), " "), "github.com/tollgate/caddy-tollgate@<version>") {
		t.Error("the Install section does not name the @<version> form")
	}
}
