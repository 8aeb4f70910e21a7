package limiter

import (
	"runtime"
	"strings"
)

// PolicyCounts returns the number of buckets the store holds per policy
// name (expired buckets the sweeper has not deleted yet included). It
// holds a shard's lock for at most sweepChunk buckets at a time, like the
// sweeper, so requests are not held up for long; the counts are a
// snapshot of a moving store.
func (m *MemoryStore) PolicyCounts() map[string]int {
	counts := map[string]int{}
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		seen := 0
		for k := range sh.m {
			if p, ok := keyPolicy(k); ok {
				counts[p]++
			}
			if seen++; seen%sweepChunk == 0 {
				sh.mu.Unlock()
				runtime.Gosched()
				sh.mu.Lock()
			}
		}
		sh.mu.Unlock()
	}
	return counts
}

// keyPolicy returns the policy of a key built by AppendKey: the segment
// after "}:" (an escaped tenant holds no brace), up to the next ':'.
func keyPolicy(key string) (string, bool) {
	i := strings.Index(key, "}:")
	if i < 0 {
		return "", false
	}
	rest := key[i+2:]
	if j := strings.IndexByte(rest, ':'); j >= 0 {
		rest = rest[:j]
	}
	return rest, true
}
