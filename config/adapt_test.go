package config_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	// The rate_limit directive and module.
	_ "github.com/tollgate/caddy-tollgate"
	"github.com/tollgate/caddy-tollgate/config"
)

// goldenSep separates the Caddyfile from the expected JSON (or the expected
// error text) in testdata/*.caddyfiletest, as in Caddy's own adapt tests.
const goldenSep = "\n----------\n"

// TestCaddyfileAdapt adapts every testdata/*.caddyfiletest with Caddy's
// caddyfile adapter and compares the result with the JSON after the
// separator; when the expected part does not start with '{' it is text the
// adapt error must contain. UPDATE_GOLDEN=1 rewrites the JSON parts. Every
// rate_limit handler in the output must also pass Validate.
func TestCaddyfileAdapt(t *testing.T) {
	files, err := filepath.Glob("testdata/*.caddyfiletest")
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden files: %v", err)
	}
	update := os.Getenv("UPDATE_GOLDEN") == "1"
	adapter := caddyconfig.GetAdapter("caddyfile")
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			text := strings.ReplaceAll(string(data), "\r\n", "\n")
			input, expected, ok := strings.Cut(text, goldenSep)
			if !ok {
				t.Fatalf("missing %q separator line", strings.TrimSpace(goldenSep))
			}
			input = strings.TrimSpace(input) + "\n"
			expected = strings.TrimSpace(expected)

			out, warnings, err := adapter.Adapt([]byte(input), map[string]any{"filename": "Caddyfile"})
			for _, w := range warnings {
				t.Logf("warning: %s:%d: %s: %s", file, w.Line, w.Directive, w.Message)
			}

			if expected != "" && expected[0] != '{' {
				if err == nil {
					t.Fatalf("adapt succeeded; want an error containing %q", expected)
				}
				if !strings.Contains(err.Error(), expected) {
					t.Fatalf("adapt error:\n%v\nwant it to contain:\n%s", err, expected)
				}
				return
			}
			if err != nil {
				t.Fatalf("adapt: %v", err)
			}
			var pretty bytes.Buffer
			if err := json.Indent(&pretty, out, "", "\t"); err != nil {
				t.Fatal(err)
			}
			if update {
				golden := input + strings.TrimPrefix(goldenSep, "\n") + pretty.String() + "\n"
				if err := os.WriteFile(file, []byte(golden), 0o644); err != nil {
					t.Fatal(err)
				}
			} else if got, want := config.NormalizeJSON(t, out), config.NormalizeJSON(t, []byte(expected)); got != want {
				t.Errorf("adapted JSON differs (UPDATE_GOLDEN=1 rewrites it)\n--- got:\n%s\n--- want:\n%s", got, want)
			}

			handlers := findRateLimitHandlers(t, out)
			if len(handlers) == 0 {
				t.Fatal("no rate_limit handler in the adapted config")
			}
			for _, raw := range handlers {
				var h config.Handler
				if err := json.Unmarshal(raw, &h); err != nil {
					t.Fatalf("decoding adapted handler: %v", err)
				}
				if _, err := h.Validate(); err != nil {
					t.Errorf("adapted handler fails Validate: %v\n%s", err, raw)
				}
			}
		})
	}
}

// findRateLimitHandlers returns every JSON object with "handler":"rate_limit"
// anywhere in the config.
func findRateLimitHandlers(t *testing.T, config []byte) []json.RawMessage {
	t.Helper()
	var v any
	if err := json.Unmarshal(config, &v); err != nil {
		t.Fatal(err)
	}
	var found []json.RawMessage
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if v["handler"] == "rate_limit" {
				raw, err := json.Marshal(v)
				if err != nil {
					t.Fatal(err)
				}
				found = append(found, raw)
			}
			for _, e := range v {
				walk(e)
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	walk(v)
	return found
}
