package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"

	"github.com/kvgate/kvgate/internal/gateway"
)

// securityOptions are the flags that decide who may use which plane and what a request may cost.
type securityOptions struct {
	adminHost      string
	adminPort      int
	adminOnAPIPort bool
	apiKeys        keyList
	apiKeyFile     string
	adminKeyFile   string
	workerAPIKey   string
}

// keyList collects keys over repeated uses of a flag, each use comma-separated (a key cannot
// contain a comma). Its String never shows a key, so that -h and errors cannot print one.
type keyList []string

func (k *keyList) String() string {
	if k == nil || len(*k) == 0 {
		return ""
	}
	return fmt.Sprintf("(%d keys)", len(*k))
}

func (k *keyList) Set(v string) error {
	for _, f := range strings.Split(v, ",") {
		if f = strings.TrimSpace(f); f != "" {
			*k = append(*k, f)
		}
	}
	return nil
}

// secretFlag is a string flag whose value is never printed.
type secretFlag struct{ v *string }

func (s secretFlag) String() string {
	if s.v == nil || *s.v == "" {
		return ""
	}
	return "(set)"
}

func (s secretFlag) Set(v string) error { *s.v = strings.TrimSpace(v); return nil }

func addSecurityFlags(fs *flag.FlagSet, o *serveOptions) {
	sec, g, l := &o.sec, &o.gw, &o.gw.Limits
	d := gateway.DefaultLimits()
	fs.Var(&sec.apiKeys, "api-key", "a key clients must send as a bearer token (repeatable, or comma-separated; also $KVGATE_API_KEYS and --api-key-file; none = the data plane is open)")
	fs.StringVar(&sec.apiKeyFile, "api-key-file", "", "file of data-plane keys, one per line (# comments), so that no key shows in ps")
	fs.Var(secretFlag{&g.AdminKey}, "admin-key", "key the admin routes require (also $KVGATE_ADMIN_KEY and --admin-key-file); required before the admin plane listens beyond loopback")
	fs.StringVar(&sec.adminKeyFile, "admin-key-file", "", "file holding the admin key")
	fs.StringVar(&sec.adminHost, "admin-host", "127.0.0.1", "address the admin plane (/workers, /get_loads) listens on")
	fs.IntVar(&sec.adminPort, "admin-port", 30001, "admin plane port (0 = any free port, negative = no admin listener)")
	fs.BoolVar(&sec.adminOnAPIPort, "admin-on-api-port", false, "also serve the admin routes on the API port (requires the admin key)")
	fs.Var(secretFlag{&sec.workerAPIKey}, "worker-api-key", "bearer key sent to the workers given by flag that have none of their own (also $KVGATE_WORKER_API_KEY; a worker's api_key label overrides it)")
	fs.BoolVar(&g.Proxy.ForwardClientAuth, "forward-client-auth", false, "send the client's Authorization header on to workers (off: it holds this gateway's key)")
	fs.Var((*listFlag)(&g.AllowedWorkerHosts), "allowed-worker-hosts", "CIDRs and host names (.suffix for a domain) workers may be registered at (none = any)")
	fs.Var((*listFlag)(&g.CORSAllowedOrigins), "cors-allowed-origins", "browser origins allowed to call the data plane, or * (none = no CORS)")
	fs.DurationVar(&l.HeaderReadTimeout, "header-read-timeout", d.HeaderReadTimeout, "bound on receiving a request's headers")
	fs.DurationVar(&l.BodyReadTimeout, "body-read-timeout", d.BodyReadTimeout, "bound on receiving a request's body, from the end of its headers (408 after)")
	fs.DurationVar(&l.IdleTimeout, "idle-timeout", d.IdleTimeout, "close a keep-alive connection idle this long")
	fs.IntVar(&l.MaxHeaderBytes, "max-header-bytes", d.MaxHeaderBytes, "largest request header block (431 above)")
	fs.Int64Var(&l.MaxUpstreamHeaderBytes, "max-upstream-header-bytes", d.MaxUpstreamHeaderBytes, "largest worker response header block (502 above)")
}

// resolveSecurity gathers the keys from flags, files and the environment, and refuses a
// configuration that would expose the admin plane without a key.
func resolveSecurity(o *serveOptions) error {
	sec := &o.sec
	if env := os.Getenv("KVGATE_API_KEYS"); env != "" {
		_ = sec.apiKeys.Set(env)
	}
	if sec.apiKeyFile != "" {
		keys, err := readKeyFile(sec.apiKeyFile)
		if err != nil {
			return fmt.Errorf("--api-key-file: %w", err)
		}
		if len(keys) == 0 {
			return fmt.Errorf("--api-key-file %s holds no key", sec.apiKeyFile)
		}
		sec.apiKeys = append(sec.apiKeys, keys...)
	}
	o.gw.APIKeys = sec.apiKeys
	if o.gw.AdminKey == "" && sec.adminKeyFile != "" {
		keys, err := readKeyFile(sec.adminKeyFile)
		if err != nil {
			return fmt.Errorf("--admin-key-file: %w", err)
		}
		if len(keys) != 1 {
			return fmt.Errorf("--admin-key-file %s must hold exactly one key", sec.adminKeyFile)
		}
		o.gw.AdminKey = keys[0]
	}
	if o.gw.AdminKey == "" {
		o.gw.AdminKey = strings.TrimSpace(os.Getenv("KVGATE_ADMIN_KEY"))
	}
	if sec.workerAPIKey == "" {
		sec.workerAPIKey = strings.TrimSpace(os.Getenv("KVGATE_WORKER_API_KEY"))
	}
	if o.gw.AuditIDKey == "" {
		o.gw.AuditIDKey = strings.TrimSpace(os.Getenv("KVGATE_AUDIT_ID_KEY"))
	}
	o.gw.AdminOnDataPlane = sec.adminOnAPIPort
	if sec.adminPort >= 0 && !isLoopback(sec.adminHost) && o.gw.AdminKey == "" {
		return fmt.Errorf("--admin-host %s is not a loopback address: set --admin-key (or $KVGATE_ADMIN_KEY) before the admin plane listens there", sec.adminHost)
	}
	if sec.adminOnAPIPort && o.gw.AdminKey == "" {
		return errors.New("--admin-on-api-port needs an admin key (--admin-key, --admin-key-file or $KVGATE_ADMIN_KEY)")
	}
	return o.gw.Validate()
}

// readKeyFile reads keys one per line; blank lines and lines starting with # are skipped.
func readKeyFile(path string) ([]string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var keys []string
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		if k := strings.TrimSpace(sc.Text()); k != "" && !strings.HasPrefix(k, "#") {
			keys = append(keys, k)
		}
	}
	return keys, sc.Err()
}

// isLoopback reports whether host (a listen address) accepts connections from this machine only.
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// logPlanes says at start-up which planes listen where and who may use them.
func logPlanes(log *slog.Logger, o *serveOptions, api, admin, metrics string) {
	who := "anyone who reaches it (no API key)"
	if n := len(o.gw.APIKeys); n > 0 {
		who = fmt.Sprintf("clients with one of %d API keys", n)
	}
	if isLoopback(o.host) {
		who += ", from this machine only"
	}
	log.Info("data plane (/v1/*, /generate)", "listen", "http://"+api, "open_to", who)
	adminWho := "nobody (no admin listener)"
	if admin != "" {
		adminWho = "processes on this machine (loopback), no key"
		if !isLoopback(o.sec.adminHost) {
			adminWho = "anyone who reaches it"
		}
		if o.gw.AdminKey != "" {
			adminWho += ", with the admin key"
		}
	}
	log.Info("admin plane (/workers, /get_loads)", "listen", orNone(admin), "open_to", adminWho)
	if o.gw.AdminOnDataPlane {
		log.Info("admin routes are also served on the API port, with the admin key", "listen", "http://"+api)
	}
	if metrics != "" {
		log.Info("metrics plane (/metrics)", "listen", "http://"+metrics, "open_to", "anyone who reaches it, no key")
	}
	beyondLoopback := (admin != "" && !isLoopback(o.sec.adminHost)) || o.gw.AdminOnDataPlane
	if beyondLoopback && len(o.gw.AllowedWorkerHosts) == 0 {
		log.Warn("the admin plane is reachable beyond loopback and any host may be registered as a worker: set --allowed-worker-hosts to the networks your workers live in")
	}
}

func orNone(addr string) string {
	if addr == "" {
		return "none"
	}
	return "http://" + addr
}
