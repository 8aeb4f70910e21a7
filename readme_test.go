package tollgate

import (
	"os"
	"regexp"
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
