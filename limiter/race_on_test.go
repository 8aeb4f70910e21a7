//go:build race

package limiter

// raceDetector: the race detector makes sync.Pool drop items at random, so
// allocation counts are not meaningful.
const raceDetector = true
