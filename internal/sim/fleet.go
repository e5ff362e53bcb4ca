package sim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Fleet is a set of simulated servers, each on its own port. Close stops all of them.
type Fleet struct {
	servers []*Server
	https   []*http.Server
	urls    []string
	wg      sync.WaitGroup
	stop    func() bool // stops the context watcher
	once    sync.Once
}

// StartFleet serves n simulated servers configured by cfg on host, on ports basePort,
// basePort+1, …; basePort 0 means ephemeral ports on 127.0.0.1 (host ignored). The fleet stops
// when ctx is done or Close is called. Each server's fault knobs can be changed afterwards with
// (*Server).SetFaults.
func StartFleet(ctx context.Context, n int, host string, basePort int, cfg Config) (*Fleet, error) {
	if n < 1 {
		return nil, fmt.Errorf("sim: fleet size %d must be positive", n)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if basePort < 0 || basePort > 0 && basePort+n-1 > 65535 {
		return nil, fmt.Errorf("sim: ports %d..%d out of range", basePort, basePort+n-1)
	}
	f := &Fleet{}
	for i := range n {
		addr := "127.0.0.1:0"
		if basePort > 0 {
			addr = net.JoinHostPort(host, strconv.Itoa(basePort+i))
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("sim: engine %d: %w", i, err)
		}
		c := cfg
		c.Seed = cfg.Seed + uint64(i)
		s := NewServer(c)
		if c.Events.Enabled() {
			h := host
			if basePort == 0 {
				h = "127.0.0.1"
			}
			if err := s.startEvents(h, ln.Addr().String(), i); err != nil {
				s.Close()
				ln.Close()
				f.Close()
				return nil, err
			}
		}
		hs := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
		f.servers = append(f.servers, s)
		f.https = append(f.https, hs)
		f.urls = append(f.urls, "http://"+ln.Addr().String())
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				// The listener failed on its own; the server is as good as killed.
				s.Close()
			}
		}()
	}
	f.stop = context.AfterFunc(ctx, f.Close)
	return f, nil
}

// URLs returns the base URLs of the servers, in order.
func (f *Fleet) URLs() []string { return append([]string(nil), f.urls...) }

// Servers returns the servers, in order.
func (f *Fleet) Servers() []*Server { return append([]*Server(nil), f.servers...) }

// Kill stops server i as a crash would: its listener and every open connection close at once
// and its engine stops. Killing a server twice, or after Close, does nothing.
func (f *Fleet) Kill(i int) {
	_ = f.https[i].Close()
	f.servers[i].Close()
}

// Close stops every server and waits for their goroutines to exit. It is idempotent.
func (f *Fleet) Close() {
	f.once.Do(func() {
		if f.stop != nil {
			f.stop()
		}
		for i := range f.https {
			f.Kill(i)
		}
		f.wg.Wait()
	})
}
