// relayload: the compiled upstream and closed-loop client of benchmarks/relay_load.py.
//
// Both sides are Go (standard library only) so that the load they put on the machine is small
// and steady next to the relay being measured, which runs pinned on a CPU of its own.
//
//	relayload upstream -listen 127.0.0.1:PORT -sink 127.0.0.1:PORT -tokens 64 -pace 50
//	relayload client -url http://127.0.0.1:PORT/v1/chat/completions -streams 256 -stagger 1.3s -warmup 3s -duration 15s
//
// The upstream answers every POST with an OpenAI chat stream: a role event at once, then one
// content event per token at a fixed pace (the first one interval after the request), the
// finish event, a usage event and [DONE], each flushed on its own as a runtime sends it. The
// sink (optional) answers 200 to anything, as an OTLP/HTTP collector that accepts everything.
//
// The client keeps -streams requests in flight (one goroutine each: a new request as soon as
// the previous answer ended) and prints one JSON object: content events per second delivered
// in the measured window, time to first content event and the gaps between content events
// (percentiles in milliseconds), requests completed and failed.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: relayload upstream|client [flags]")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "upstream":
		upstream(os.Args[2:])
	case "client":
		client(os.Args[2:])
	default:
		fmt.Fprintf(os.Stderr, "relayload: unknown mode %q\n", os.Args[1])
		os.Exit(2)
	}
}

// -- the upstream --------------------------------------------------------------------------------

func upstream(args []string) {
	fs := flag.NewFlagSet("upstream", flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:0", "address of the model server")
	sink := fs.String("sink", "", "address of an OTLP sink that answers 200 to everything (optional)")
	tokens := fs.Int("tokens", 64, "content events per answer")
	pace := fs.Float64("pace", 50, "content events per second per answer")
	_ = fs.Parse(args)
	interval := time.Duration(float64(time.Second) / *pace)

	if *sink != "" {
		sinkLn := mustListen(*sink)
		fmt.Printf("sink %s\n", sinkLn.Addr())
		go func() {
			_ = http.Serve(sinkLn, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "application/x-protobuf")
				w.WriteHeader(200)
			}))
		}()
	}
	ln := mustListen(*listen)
	fmt.Printf("upstream %s\n", ln.Addr())
	var counter atomic.Int64
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Method != http.MethodPost {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"object":"list","data":[{"id":"m","object":"model"}]}`))
			return
		}
		id := counter.Add(1)
		flusher := w.(http.Flusher)
		h := w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		w.WriteHeader(200)
		start := time.Now()
		head := fmt.Sprintf(`data: {"id":"chatcmpl-%d","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":`, id)
		write := func(s string) bool {
			if _, err := io.WriteString(w, s); err != nil {
				return false
			}
			flusher.Flush()
			return true
		}
		if !write(head + `{"role":"assistant","content":""},"finish_reason":null}]}` + "\n\n") {
			return
		}
		for i := 1; i <= *tokens; i++ {
			time.Sleep(time.Until(start.Add(time.Duration(i) * interval)))
			if !write(fmt.Sprintf(`%s{"content":" tok%d"},"finish_reason":null}]}`+"\n\n", head, i)) {
				return
			}
		}
		write(head + `{},"finish_reason":"stop"}]}` + "\n\n")
		write(fmt.Sprintf(`data: {"id":"chatcmpl-%d","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":8,"completion_tokens":%d,"total_tokens":%d}}`+"\n\n", id, *tokens, *tokens+8))
		write("data: [DONE]\n\n")
	})
	server := &http.Server{Handler: handler, MaxHeaderBytes: 1 << 16}
	if err := server.Serve(ln); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func mustListen(address string) net.Listener {
	ln, err := net.Listen("tcp", address)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	return ln
}

// -- the client ----------------------------------------------------------------------------------

type samples struct {
	mu      sync.Mutex
	ttft    []float64 // ms, requests started in the window
	gaps    []float64 // ms, between content events that arrived in the window
	events  int64     // content events that arrived in the window
	done    int64     // requests completed in the window
	failed  int64     // requests that failed (any time after the warm-up)
	errText string
}

func client(args []string) {
	fs := flag.NewFlagSet("client", flag.ExitOnError)
	url := fs.String("url", "", "the chat completions URL")
	streams := fs.Int("streams", 64, "requests kept in flight")
	warmup := fs.Duration("warmup", 3*time.Second, "unmeasured time first (the streams ramp up)")
	duration := fs.Duration("duration", 15*time.Second, "measured time")
	stagger := fs.Duration("stagger", 20*time.Millisecond, "the streams' first requests spread over this long")
	header := fs.String("header", "", "one more request header, 'Name: value' (a gateway's key)")
	_ = fs.Parse(args)
	if *url == "" {
		fmt.Fprintln(os.Stderr, "relayload client: -url is required")
		os.Exit(2)
	}
	transport := &http.Transport{
		MaxIdleConns: *streams * 2, MaxIdleConnsPerHost: *streams * 2, MaxConnsPerHost: 0,
		DisableCompression: true, IdleConnTimeout: time.Minute,
		DialContext: (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
	}
	httpClient := &http.Client{Transport: transport, Timeout: 60 * time.Second}
	body := []byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hello"}]}`)

	begin := time.Now()
	from, until := begin.Add(*warmup), begin.Add(*warmup+*duration)
	s := &samples{}
	var wg sync.WaitGroup
	for i := 0; i < *streams; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			// independent callers: the first requests spread evenly (an answer's length spreads
			// them as users' requests are; a short spread makes every stream end and restart in waves)
			time.Sleep(time.Duration(i) * *stagger / time.Duration(*streams))
			for time.Now().Before(until) {
				one(httpClient, *url, *header, body, from, until, s)
			}
		}(i)
	}
	wg.Wait()
	elapsed := duration.Seconds()
	out := map[string]any{
		"streams":       *streams,
		"seconds":       elapsed,
		"chunks_per_s":  float64(s.events) / elapsed,
		"requests":      s.done,
		"errors":        s.failed,
		"ttft_ms":       quantiles(s.ttft),
		"gap_ms":        quantiles(s.gaps),
		"first_error":   s.errText,
		"ttft_samples":  len(s.ttft),
		"gap_samples":   len(s.gaps),
	}
	_ = json.NewEncoder(os.Stdout).Encode(out)
}

func one(c *http.Client, url string, header string, body []byte, from, until time.Time, s *samples) {
	start := time.Now()
	measured := !start.Before(from) && start.Before(until)
	var ttft float64 = -1
	var gaps []float64
	var events int64
	fail := func(err error) {
		if start.Before(from) {
			return
		}
		s.mu.Lock()
		s.failed++
		if s.errText == "" {
			s.errText = err.Error()
		}
		s.mu.Unlock()
	}
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		fail(err)
		return
	}
	req.Header.Set("Content-Type", "application/json")
	if name, value, found := strings.Cut(header, ":"); found {
		req.Header.Set(strings.TrimSpace(name), strings.TrimSpace(value))
	}
	resp, err := c.Do(req)
	if err != nil {
		fail(err)
		time.Sleep(10 * time.Millisecond)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		_, _ = io.Copy(io.Discard, resp.Body)
		fail(fmt.Errorf("status %d", resp.StatusCode))
		return
	}
	reader := bufio.NewReaderSize(resp.Body, 16*1024)
	var last time.Time
	sawDone := false
	for {
		line, err := reader.ReadSlice('\n')
		if len(line) > 0 && bytes.HasPrefix(line, []byte("data: ")) {
			now := time.Now()
			if bytes.Contains(line, []byte(`"content":" tok`)) {
				if last.IsZero() {
					ttft = float64(now.Sub(start).Microseconds()) / 1000
				} else if !now.Before(from) && now.Before(until) {
					gaps = append(gaps, float64(now.Sub(last).Microseconds())/1000)
				}
				if !now.Before(from) && now.Before(until) {
					events++
				}
				last = now
			} else if strings.HasPrefix(string(line), "data: [DONE]") {
				sawDone = true
			}
		}
		if err != nil {
			if err != io.EOF {
				fail(err)
				return
			}
			break
		}
	}
	if !sawDone {
		fail(fmt.Errorf("the stream ended without [DONE]"))
	}
	end := time.Now()
	s.mu.Lock()
	if measured && ttft >= 0 {
		s.ttft = append(s.ttft, ttft)
	}
	s.gaps = append(s.gaps, gaps...)
	s.events += events
	if sawDone && !end.Before(from) && end.Before(until) {
		s.done++
	}
	s.mu.Unlock()
}

func quantiles(values []float64) map[string]float64 {
	if len(values) == 0 {
		return map[string]float64{}
	}
	sort.Float64s(values)
	at := func(q float64) float64 {
		i := int(q * float64(len(values)-1))
		return values[i]
	}
	return map[string]float64{"p50": at(0.50), "p90": at(0.90), "p99": at(0.99), "max": values[len(values)-1]}
}
