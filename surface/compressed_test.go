package surface

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"github.com/tollgate/caddy-tollgate/internal/llm"
)

func TestDecoderWindows(t *testing.T) {
	body := []byte(strings.Repeat("rate limit ", 10000))
	zstdFrame := func(opts ...zstd.EOption) []byte {
		var b bytes.Buffer
		w, _ := zstd.NewWriter(&b, opts...)
		w.Write(body[:100])
		w.Flush() // streamed: the size is not known in the header
		w.Write(body[100:])
		w.Close()
		return b.Bytes()
	}
	for _, tc := range []struct {
		name string
		got  int64
		want int64
	}{
		{"zstd 128 KiB window (Caddy's encode)", zstdWindow(zstdFrame(zstd.WithWindowSize(128 << 10))), 128 << 10},
		{"zstd default stream", zstdWindow(zstdFrame()), 8 << 20},
		{"zstd whole body at once", zstdWindow(func() []byte { e, _ := zstd.NewWriter(nil); return e.EncodeAll(body[:5000], nil) }()), 5000},
		{"zstd single segment header", zstdWindow([]byte{0x28, 0xB5, 0x2F, 0xFD, 0x20 | 0x40, 0x10, 0x27}), 10000 + 256},
		{"zstd not a frame", zstdWindow([]byte("hello world")), maxZstdWindow},
		{"brotli lgwin 18", brotliWindow(func() []byte {
			var b bytes.Buffer
			w := brotli.NewWriterOptions(&b, brotli.WriterOptions{Quality: 5, LGWin: 18})
			w.Write(body)
			w.Close()
			return b.Bytes()
		}()), 1<<18 - 16},
		{"brotli default", brotliWindow(func() []byte {
			var b bytes.Buffer
			w := brotli.NewWriter(&b)
			w.Write(body)
			w.Close()
			return b.Bytes()
		}()), 1<<22 - 16},
		{"brotli nothing", brotliWindow(nil), 1 << 24},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: window %d, want %d", tc.name, tc.got, tc.want)
		}
	}
}

// TestSideDecoderWindowMemory: a zstd stream whose window does not fit in
// what is left of maxWindowMemory is not read; gzip is not counted; the
// reservation goes back when the decoder ends.
func TestSideDecoderWindowMemory(t *testing.T) {
	var zb, gb bytes.Buffer
	zw, _ := zstd.NewWriter(&zb)
	gw := gzip.NewWriter(&gb)
	for _, w := range []io.WriteCloser{zw, gw} {
		w.Write([]byte(`{"usage":{"total_tokens":7}}`))
		w.Close()
	}
	decode := func(enc string, body []byte) (string, error) {
		var got bytes.Buffer
		d := startSideDecoder(enc, func(p []byte) { got.Write(p) })
		d.Write(body)
		err := d.finish()
		return got.String(), err
	}
	windowMemory.Store(maxWindowMemory - 1<<10) // 1 KiB left
	t.Cleanup(func() { windowMemory.Store(0) })
	if got, err := decode("zstd", zb.Bytes()); err != errWindowMemory || got != "" {
		t.Errorf("zstd with 1 KiB left: %q, %v; want nothing read, %v", got, err, errWindowMemory)
	}
	if got, err := decode("gzip", gb.Bytes()); err != nil || got != `{"usage":{"total_tokens":7}}` {
		t.Errorf("gzip with 1 KiB left: %q, %v", got, err)
	}
	if windowMemory.Load() != maxWindowMemory-1<<10 {
		t.Errorf("window memory %d after the decoders ended, want %d", windowMemory.Load(), maxWindowMemory-1<<10)
	}
	windowMemory.Store(0)
	if got, err := decode("zstd", zb.Bytes()); err != nil || got != `{"usage":{"total_tokens":7}}` {
		t.Errorf("zstd with room: %q, %v", got, err)
	}
	if windowMemory.Load() != 0 {
		t.Errorf("window memory %d after the decoder ended, want 0", windowMemory.Load())
	}
}

// TestSideDecoderBomb: a body that inflates beyond 256 times its size
// (plus 1 MiB) stops being read, with errInflated; what came before the
// bound was fed.
func TestSideDecoderBomb(t *testing.T) {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	zw.Write([]byte(`{"usage":{"total_tokens":7},"pad":"`))
	zw.Write(bytes.Repeat([]byte{'0'}, 64<<20))
	zw.Write([]byte(`"}`))
	zw.Close()
	var fed int64
	d := startSideDecoder("gzip", func(p []byte) { fed += int64(len(p)) })
	for rest := b.Bytes(); len(rest) > 0; {
		n := min(len(rest), 4096)
		d.Write(rest[:n])
		rest = rest[n:]
	}
	if err := d.finish(); err != errInflated {
		t.Fatalf("a %d-byte body inflating to 64 MiB: %v, want %v", b.Len(), err, errInflated)
	}
	if limit := int64(maxInflation*b.Len() + inflationSlack); fed > limit || fed == 0 {
		t.Errorf("fed %d bytes, want some and at most %d", fed, limit)
	}
}

// TestOnlyGzipWhenWindowsRunOut: once the decoder windows are nearly all
// taken, a preset request asks its upstream for gzip only, whose answers
// can still be read.
func TestOnlyGzipWhenWindowsRunOut(t *testing.T) {
	h := &Server{}
	ask := func(ae string) string {
		r, _ := http.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
		if ae != "" {
			r.Header.Set("Accept-Encoding", ae)
		}
		h.inspectLLMRequest(r, &requestState{bodyLen: -1}, llm.OpenAI)
		return r.Header.Get("Accept-Encoding")
	}
	if got := ask("zstd, br, gzip"); got != "zstd, br, gzip" {
		t.Errorf("with room: Accept-Encoding %q, want it as sent", got)
	}
	windowMemory.Store(maxWindowMemory - windowHeadroom + 1)
	t.Cleanup(func() { windowMemory.Store(0) })
	for ae, want := range map[string]string{"zstd, br, gzip;q=0.5": "gzip", "br": "", "GZIP": "gzip", "": ""} {
		if got := ask(ae); got != want {
			t.Errorf("windows nearly full, Accept-Encoding %q: sent on %q, want %q", ae, got, want)
		}
	}
}
