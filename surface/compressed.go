package surface

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// Compressed metered responses. The client gets the body exactly as the
// upstream compressed it; a decoder on the side reads the same bytes
// decompressed into the extractors. Decoders are pull readers, so each
// compressed metered response has one goroutine that reads from a pipe:
// Write hands it each chunk and returns once the chunk is decoded. Nothing
// is queued, so a response costs its decoder's state (a 32 KiB window for
// gzip, at most 8 MiB for zstd and 16 MiB for brotli, as large as the
// upstream's encoder chose), whatever the size of the body. The windows
// of the zstd and brotli decoders running at once are bounded per process
// (maxWindowMemory): a stream that does not fit is not read, and is a
// missing cost.

// maxWindowMemory bounds the zstd and brotli windows decoded at once in
// this process: 32 streams of an 8 MiB window, or 2048 of 128 KiB.
const maxWindowMemory = 256 << 20

// windowMemory is what the running zstd and brotli decoders reserved.
var windowMemory atomic.Int64

// errWindowMemory stops a decoder that would exceed maxWindowMemory.
var errWindowMemory = errors.New("decoder windows of the compressed responses being read exceed 256 MiB")

// maxInflation bounds the decompressed bytes read per compressed byte
// (plus inflationSlack): a decompression bomb stops being read, and is
// charged as a response whose cost is missing, instead of costing the
// instance minutes of CPU. JSON and event streams compress 5 to 50 times.
const (
	maxInflation   = 256
	inflationSlack = 1 << 20
)

// maxZstdWindow is the largest zstd window decoded: the limit RFC 9659
// sets for the zstd content coding, so a conforming upstream never
// exceeds it.
const maxZstdWindow = 8 << 20

// errInflated stops a decoder whose output outgrew maxInflation.
var errInflated = errors.New("decompressed body grew beyond 256 times its compressed size")

// sideDecodable reports whether a body with Content-Encoding enc can be
// read on the side: one coding of gzip, br or zstd.
func sideDecodable(enc string) bool {
	_, ok := decoderFor(enc)
	return ok
}

// decoderPool reuses the decoders of one coding.
type decoderPool struct {
	name string
	pool sync.Pool
	// open returns a decoder reading r, new or from the pool.
	open func(p *decoderPool, r io.Reader) (io.Reader, error)
	// close releases d (and what it references) into the pool.
	close func(p *decoderPool, d io.Reader)
}

var (
	gzipDecoders = &decoderPool{
		name: "gzip",
		open: func(p *decoderPool, r io.Reader) (io.Reader, error) {
			if d, ok := p.pool.Get().(*gzip.Reader); ok {
				return d, d.Reset(r)
			}
			return gzip.NewReader(r)
		},
		close: func(p *decoderPool, d io.Reader) { p.pool.Put(d) },
	}
	brotliDecoders = &decoderPool{
		name: "br",
		open: func(p *decoderPool, r io.Reader) (io.Reader, error) {
			if d, ok := p.pool.Get().(*brotli.Reader); ok {
				return d, d.Reset(r)
			}
			return brotli.NewReader(r), nil
		},
		close: func(p *decoderPool, d io.Reader) { p.pool.Put(d) },
	}
	zstdDecoders = &decoderPool{
		name: "zstd",
		open: func(p *decoderPool, r io.Reader) (io.Reader, error) {
			if d, ok := p.pool.Get().(*zstd.Decoder); ok {
				return d, d.Reset(r)
			}
			// One block at a time, in this goroutine: no decoder
			// goroutines, memory as small as the stream allows.
			return zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
				zstd.WithDecoderMaxWindow(maxZstdWindow))
		},
		close: func(p *decoderPool, d io.Reader) {
			z := d.(*zstd.Decoder)
			_ = z.Reset(nil) // drops the reference to the pipe
			p.pool.Put(z)
		},
	}
)

// decoderFor returns the decoders of Content-Encoding enc.
func decoderFor(enc string) (*decoderPool, bool) {
	switch strings.ToLower(strings.TrimSpace(enc)) {
	case "gzip", "x-gzip":
		return gzipDecoders, true
	case "br":
		return brotliDecoders, true
	case "zstd":
		return zstdDecoders, true
	}
	return nil, false
}

// sideDecoder decodes a compressed body on the side and feeds what it
// decodes to feed, in its own goroutine.
type sideDecoder struct {
	pw   *io.PipeWriter
	done chan struct{}
	// err says why decoding stopped before the end of the body (nil when
	// the body was decoded to its end, or was cut short by the response
	// ending); read after done is closed.
	err error
}

// startSideDecoder starts decoding a body of Content-Encoding enc (one
// sideDecodable says yes to) and calls feed with each decoded chunk, from
// another goroutine, until finish.
func startSideDecoder(enc string, feed func([]byte)) *sideDecoder {
	pool, _ := decoderFor(enc)
	pr, pw := io.Pipe()
	d := &sideDecoder{pw: pw, done: make(chan struct{})}
	go d.run(pool, pr, feed)
	return d
}

// run decodes until the end of the body, an error, or inflation.
func (d *sideDecoder) run(pool *decoderPool, pr *io.PipeReader, feed func([]byte)) {
	defer close(d.done)
	defer func() {
		// A decoder's panic on a hostile stream must not take the
		// process down: this goroutine is not the request's.
		if v := recover(); v != nil {
			d.err = fmt.Errorf("decoding the %s body: panic: %v", pool.name, v)
			pr.CloseWithError(errDecoderStopped)
		}
	}()
	in := &countingReader{r: pr}
	head := bufio.NewReaderSize(in, 64)
	reserved, err := reserveWindow(pool, head)
	defer windowMemory.Add(-reserved)
	var dec io.Reader
	if err == nil {
		dec, err = pool.open(pool, head)
	}
	if err == nil {
		bp := decodeBuffers.Get().(*[]byte)
		err = d.decode(dec, in, *bp, feed)
		decodeBuffers.Put(bp)
		pool.close(pool, dec)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		err = nil // the response ended mid-stream: what was decoded counts
	}
	d.err = err
	// Later writes fail at once instead of waiting for a reader.
	pr.CloseWithError(errDecoderStopped)
}

var errDecoderStopped = errors.New("side decoder stopped")

// reserveWindow reserves in windowMemory the window of the zstd or brotli
// stream that head starts (read from its first bytes), plus the decoder's
// buffers. gzip's 32 KiB window is not counted.
func reserveWindow(pool *decoderPool, head *bufio.Reader) (int64, error) {
	var window int64
	switch pool {
	case zstdDecoders:
		b, _ := head.Peek(zstdMaxHeader)
		window = zstdWindow(b) + 128<<10
	case brotliDecoders:
		b, _ := head.Peek(2)
		window = brotliWindow(b) + 64<<10
	default:
		return 0, nil
	}
	if windowMemory.Add(window) > maxWindowMemory {
		windowMemory.Add(-window)
		return 0, errWindowMemory
	}
	return window, nil
}

// zstdMaxHeader is the longest zstd frame header: magic, descriptor,
// window, dictionary id and content size.
const zstdMaxHeader = 4 + 1 + 1 + 4 + 8

// zstdWindow is the window of the zstd frame whose first bytes are b
// (RFC 8878 3.1.1.1): maxZstdWindow when b is not a frame header the
// decoder would accept.
func zstdWindow(b []byte) int64 {
	if len(b) < 6 || b[0] != 0x28 || b[1] != 0xB5 || b[2] != 0x2F || b[3] != 0xFD {
		return maxZstdWindow
	}
	fhd := b[4]
	if fhd&0x20 == 0 { // a window descriptor
		exp, mantissa := int64(b[5]>>3), int64(b[5]&7)
		base := int64(1) << (10 + exp)
		return min(base+base/8*mantissa, maxZstdWindow)
	}
	// Single segment: the window is the content size.
	i := 5 + []int{0, 1, 2, 4}[fhd&3]
	n := []int{1, 2, 4, 8}[fhd>>6]
	if len(b) < i+n {
		return maxZstdWindow
	}
	var size uint64
	for k := n - 1; k >= 0; k-- {
		size = size<<8 | uint64(b[i+k])
	}
	if n == 2 {
		size += 256
	}
	return int64(min(size, maxZstdWindow))
}

// brotliWindow is the window of the brotli stream whose first bytes are b
// (RFC 7932 9.1): 16 MiB when b is too short to tell.
func brotliWindow(b []byte) int64 {
	if len(b) == 0 {
		return 1 << 24
	}
	bits := uint16(b[0])
	if len(b) > 1 {
		bits |= uint16(b[1]) << 8
	}
	wbits := 16
	switch {
	case bits&1 == 0:
	case bits>>1&7 != 0:
		wbits = 17 + int(bits>>1&7)
	case bits>>4&7 == 1:
		return 1 << 24 // the large-window extension: not HTTP's br
	case bits>>4&7 != 0:
		wbits = 8 + int(bits>>4&7)
	default:
		wbits = 17
	}
	return int64(1)<<wbits - 16
}

// decode copies dec's output to feed, bounding its inflation.
func (d *sideDecoder) decode(dec io.Reader, in *countingReader, buf []byte, feed func([]byte)) error {
	var out int64
	for {
		n, err := dec.Read(buf)
		if n > 0 {
			out += int64(n)
			if out > maxInflation*in.n+inflationSlack {
				return errInflated
			}
			feed(buf[:n])
		}
		if err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
	}
}

// Write hands p to the decoder and returns once it is decoded (or the
// decoder has stopped).
func (d *sideDecoder) Write(p []byte) {
	_, _ = d.pw.Write(p)
}

// finish ends the body and waits for the decoder: what it fed is complete
// once finish returns. It returns why decoding stopped early, if it did.
func (d *sideDecoder) finish() error {
	_ = d.pw.Close()
	<-d.done
	return d.err
}

// decodeBuffers hold decoded bytes on their way to the extractors.
var decodeBuffers = sync.Pool{New: func() any { b := make([]byte, 16<<10); return &b }}

// countingReader counts the compressed bytes read.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
