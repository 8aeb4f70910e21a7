package surface

import "testing"

// TestOverloadAnswer: only what an overloaded upstream or its proxy
// answers shrinks the protect limit; an application's 500 does not.
func TestOverloadAnswer(t *testing.T) {
	for status, want := range map[int]bool{
		200: false, 404: false, 429: true, 499: false,
		500: false, 501: false, 502: true, 503: true, 504: true, 505: false,
	} {
		if got := overloadAnswer(status); got != want {
			t.Errorf("overloadAnswer(%d) = %v, want %v", status, got, want)
		}
	}
}
