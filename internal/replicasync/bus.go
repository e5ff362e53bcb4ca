package replicasync

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Modes of Options.Spec besides a URL list.
const (
	ModeOff      = "off"
	ModeEmbedded = "embedded"
)

// Options say how a replica reaches the bus (kvgate serve --replica-sync …).
type Options struct {
	// Spec is ModeOff (or ""), ModeEmbedded, or an existing NATS cluster's URLs, comma-separated
	// (nats://HOST:PORT; tls://HOST:PORT connects with TLS).
	Spec string
	// CredsFile is a NATS credentials file (JWT and nkey seed) for an existing cluster.
	CredsFile string
	// User and Password, or Token, authenticate to an existing cluster without a creds file
	// (from the environment; never logged).
	User, Password, Token string
	// Listen is the embedded server's cluster address, HOST:PORT, required in embedded mode
	// (port 0: any free port). It is not the API port: only replicas speak on it.
	Listen string
	// Peers are the embedded cluster's other members: nats://HOST:PORT URLs, or HOST:PORT names
	// resolved to every address they have (a headless Service).
	Peers []string
	// Key is the cluster's secret: it keys the chunk hashes in every mode and, embedded, is the
	// route password; required when Listen is beyond loopback.
	Key []byte
	// Resolve looks host names up; nil is net.DefaultResolver.LookupHost.
	Resolve func(ctx context.Context, host string) ([]string, error)
}

// Enabled reports whether o asks for a sync plane.
func (o Options) Enabled() bool {
	s := strings.TrimSpace(o.Spec)
	return s != "" && !strings.EqualFold(s, ModeOff)
}

// Validate reports the first problem with o that would make it unsafe or unusable.
func (o Options) Validate() error {
	if !o.Enabled() {
		return nil
	}
	if strings.EqualFold(strings.TrimSpace(o.Spec), ModeEmbedded) {
		host, port, err := net.SplitHostPort(o.Listen)
		if err != nil {
			return errors.New("replica sync: embedded mode needs --replica-sync-listen HOST:PORT")
		}
		if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
			return errors.New("replica sync: --replica-sync-listen has a bad port")
		}
		if len(o.Key) == 0 && !loopback(host) {
			return errors.New("replica sync: a cluster port beyond loopback needs a key (--replica-sync-key-file or KVGATE_REPLICA_SYNC_KEY)")
		}
		if len(o.Key) > 0 && len(o.Key) < 16 {
			return errors.New("replica sync: the key must be at least 16 bytes")
		}
		return nil
	}
	for _, u := range splitURLs(o.Spec) {
		p, err := url.Parse(u)
		if err != nil || (p.Scheme != "nats" && p.Scheme != "tls") || p.Host == "" {
			return fmt.Errorf("replica sync: %q is not a nats:// or tls:// URL (or off, embedded)", redact(u))
		}
		if p.User != nil {
			return errors.New("replica sync: credentials go in --replica-sync-creds or the environment, not the URL")
		}
	}
	return nil
}

func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func splitURLs(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// redact hides what a URL carries past its host.
func redact(u string) string {
	if p, err := url.Parse(u); err == nil && p.User != nil {
		p.User = url.User("redacted")
		return p.String()
	}
	return u
}

// Start connects a Plane as o says: to an existing cluster, or through an embedded server
// clustered with the peers. The caller closes it.
func Start(ctx context.Context, o Options, cfg PlaneConfig) (*Plane, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if !o.Enabled() {
		return nil, errors.New("replica sync: off")
	}
	cfg.Node.Key = o.Key
	if strings.EqualFold(strings.TrimSpace(o.Spec), ModeEmbedded) {
		srv, err := startEmbedded(ctx, o)
		if err != nil {
			return nil, err
		}
		p, err := newPlane(cfg, func(opts ...nats.Option) (*nats.Conn, error) {
			return nats.Connect("", append(opts, nats.InProcessServer(srv.s), nats.Token(srv.token))...)
		}, srv)
		if err != nil {
			srv.shutdown()
			return nil, err
		}
		return p, nil
	}
	return newPlane(cfg, func(opts ...nats.Option) (*nats.Conn, error) {
		switch {
		case o.CredsFile != "":
			opts = append(opts, nats.UserCredentials(o.CredsFile))
		case o.Token != "":
			opts = append(opts, nats.Token(o.Token))
		case o.User != "":
			opts = append(opts, nats.UserInfo(o.User, o.Password))
		}
		return nats.Connect(strings.Join(splitURLs(o.Spec), ","), opts...)
	}, nil)
}

// embeddedServer is the in-process NATS server of embedded mode.
type embeddedServer struct {
	s     *server.Server
	token string // the client token of its loopback client port
}

func (e *embeddedServer) shutdown() {
	e.s.Shutdown()
	e.s.WaitForShutdown()
}

// ClusterAddr returns the embedded server's cluster address, nil in other modes.
func (p *Plane) ClusterAddr() net.Addr {
	if p.srv == nil {
		return nil
	}
	return p.srv.s.ClusterAddr()
}

// routeUser is the route user of an embedded cluster; its password derives from the key.
const routeUser = "kvgate"

func routePassword(key []byte) string {
	if len(key) == 0 {
		return ""
	}
	sum := sha256.Sum256(append([]byte("kvgate replica sync route v1\x00"), key...))
	return hex.EncodeToString(sum[:16])
}

// startEmbedded starts the in-process server: its cluster port on o.Listen with the key's route credentials, routes to o.Peers.
func startEmbedded(ctx context.Context, o Options) (*embeddedServer, error) {
	host, portStr, _ := net.SplitHostPort(o.Listen)
	port, _ := strconv.Atoi(portStr)
	if port == 0 {
		port = -1 // a random port (tests)
	}
	pass := routePassword(o.Key)
	routes, err := resolvePeers(ctx, o, pass)
	if err != nil {
		return nil, err
	}
	// The server's client port cannot be turned off while it routes (its routing waits for the
	// client listener), so it listens on a random loopback port with a random token that only
	// this process knows; the replica itself connects in process.
	var tok [16]byte
	if _, err := rand.Read(tok[:]); err != nil {
		return nil, err
	}
	opts := &server.Options{
		ServerName:    "kvgate-" + strconv.FormatInt(time.Now().UnixNano(), 36),
		Host:          "127.0.0.1",
		Port:          -1,
		Authorization: hex.EncodeToString(tok[:]),
		NoLog:         true,
		NoSigs:        true,
		MaxPayload:    MaxBatchBytes * 2,
		// Batches are small and latency is the point: no route compression, one route.
		Cluster: server.ClusterOpts{Name: "kvgate", Host: host, Port: port, ConnectRetries: -1,
			PoolSize: -1, Compression: server.CompressionOpts{Mode: server.CompressionOff}},
		Routes: routes,
	}
	if pass != "" {
		opts.Cluster.Username, opts.Cluster.Password = routeUser, pass
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("replica sync: embedded server: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, errors.New("replica sync: the embedded server did not start")
	}
	return &embeddedServer{s: s, token: opts.Authorization}, nil
}

// resolvePeers turns o.Peers into route URLs carrying the route credentials.
func resolvePeers(ctx context.Context, o Options, pass string) ([]*url.URL, error) {
	look := o.Resolve
	if look == nil {
		look = net.DefaultResolver.LookupHost
	}
	var out []*url.URL
	for _, p := range o.Peers {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		hostport := strings.TrimPrefix(p, "nats://")
		host, port, err := net.SplitHostPort(hostport)
		if err != nil || strings.Contains(hostport, "/") || strings.Contains(hostport, "@") {
			return nil, fmt.Errorf("replica sync: peer %q is not nats://HOST:PORT or HOST:PORT", redact(p))
		}
		hosts := []string{host}
		if net.ParseIP(host) == nil && !strings.HasPrefix(p, "nats://") {
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			addrs, err := look(rctx, host)
			cancel()
			if err != nil {
				// A headless Service lists no pod before the first is ready: the peers that
				// start later dial this one.
				continue
			}
			hosts = addrs
		}
		for _, h := range hosts {
			u := &url.URL{Scheme: "nats", Host: net.JoinHostPort(h, port)}
			if pass != "" {
				u.User = url.UserPassword(routeUser, pass)
			}
			out = append(out, u)
		}
	}
	return out, nil
}
