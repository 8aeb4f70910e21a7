package portal

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// errorf is a configuration error.
func errorf(format string, args ...any) error {
	return fmt.Errorf("rate_limit_usage: "+format, args...)
}

// writeJSON writes v with status.
func writeJSON(w http.ResponseWriter, r *http.Request, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if r.Method == http.MethodHead {
		return nil
	}
	return json.NewEncoder(w).Encode(v)
}

// writeError answers an error: JSON {"error": msg}, or a short page for a
// browser. Never cached.
func writeError(w http.ResponseWriter, r *http.Request, status int, msg string) error {
	w.Header().Set("Cache-Control", "no-store")
	if wantsHTML(r) {
		return writeErrorPage(w, r, status, msg)
	}
	return writeJSON(w, r, status, map[string]string{"error": msg})
}
