package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

func TestParseServeFlags(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "kvgate.yaml")
	os.WriteFile(cfg, []byte("policy: round_robin\nport: 31111\nworker_urls:\n  - http://10.0.0.1:8000\n  - http://10.0.0.2:8000\ncache-threshold: 0.5\n"), 0o644)
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("polcy: random\n"), 0o644)

	cases := []parseCase{
		{name: "defaults", check: func(t *testing.T, o *serveOptions) {
			if o.port != 30000 || o.promPort != 29000 || o.policyName != "cache_aware_hash" || o.gw.MaxPayloadSize != 32<<20 || o.gw.BodyBudget.Bytes != 1<<30 || len(o.workerURLs) != 0 {
				t.Errorf("defaults: %+v", o)
			}
		}},
		{name: "space separated urls", args: []string{"--worker-urls", "http://a:1", "http://b:2", "--policy", "random"}, check: func(t *testing.T, o *serveOptions) {
			if !reflect.DeepEqual([]string(o.workerURLs), []string{"http://a:1", "http://b:2"}) || o.policyName != "random" {
				t.Errorf("urls %v policy %s", o.workerURLs, o.policyName)
			}
		}},
		{name: "aliases become canonical names", args: []string{"--policy", "rr", "--prefill-policy", "cache-aware", "--decode-policy", "p2c"}, check: func(t *testing.T, o *serveOptions) {
			if o.policyName != "round_robin" || o.prefillPolicy != "cache_aware" || o.decodePolicy != "power_of_two" {
				t.Errorf("policies %s %s %s, want canonical names", o.policyName, o.prefillPolicy, o.decodePolicy)
			}
		}},
		{name: "comma separated urls", args: []string{"--worker-urls=http://a:1,http://b:2"}, check: func(t *testing.T, o *serveOptions) {
			if len(o.workerURLs) != 2 {
				t.Errorf("urls %v", o.workerURLs)
			}
		}},
		{name: "config file, flags override", args: []string{"--config", cfg, "--port", "32222"}, check: func(t *testing.T, o *serveOptions) {
			if o.policyName != "round_robin" || o.port != 32222 || len(o.workerURLs) != 2 || o.pol.CacheAware.CacheThreshold != 0.5 {
				t.Errorf("config: policy %s port %d urls %v threshold %v", o.policyName, o.port, o.workerURLs, o.pol.CacheAware.CacheThreshold)
			}
		}},
		{name: "events make precise_prefix the default", args: []string{"--kv-events-port", "5557"}, check: func(t *testing.T, o *serveOptions) {
			if o.policyName != "precise_prefix" || o.kv.events.Port != 5557 {
				t.Errorf("policy %s, port %d", o.policyName, o.kv.events.Port)
			}
		}},
		{name: "an explicit policy wins over events", args: []string{"--kv-events-bind", "tcp://127.0.0.1:5557", "--policy", "cache_aware_hash"}, check: func(t *testing.T, o *serveOptions) {
			if o.policyName != "cache_aware_hash" {
				t.Errorf("policy %s", o.policyName)
			}
		}},
		{name: "bad tokenizer", args: []string{"--tokenizer", "hf"}, wantErr: `--tokenizer "hf"`},
		{name: "unknown policy", args: []string{"--policy", "fastest"}, wantErr: `unknown policy "fastest"`},
		{name: "audit headers nobody could see", args: []string{"--audit-headers"}, wantErr: "--audit-headers: no client could see them"},
		{name: "audit headers for an unknown key", args: []string{"--audit-headers", "--api-key", "ops=s3cret", "--audit-headers-clients", "opz"}, wantErr: `no data-plane key is named "opz"`},
		{name: "short audit id key", args: []string{"--audit-headers", "--admin-key", "k", "--audit-id-key", "short"}, wantErr: "--audit-id-key: at least 16 bytes"},
		{name: "audit headers for a named key", args: []string{"--audit-headers", "--api-key", "ops=s3cret", "--audit-headers-clients", "ops", "--audit-id-key", "0123456789abcdefXYZ"}, check: func(t *testing.T, o *serveOptions) {
			if !o.gw.AuditHeaders || len(o.gw.AuditHeadersClients) != 1 || o.gw.AuditIDKey != "0123456789abcdefXYZ" {
				t.Errorf("audit config %+v %v", o.gw.AuditHeadersClients, o.gw.AuditHeaders)
			}
		}},
		{name: "unknown config key", args: []string{"--config", bad}, wantErr: `unknown key "polcy"`},
		{name: "missing config", args: []string{"--config", filepath.Join(dir, "none.yaml")}, wantErr: "no such file"},
		{name: "bad threshold", args: []string{"--cache-threshold", "3"}, wantErr: "cache_threshold"},
		{name: "bad load mode", args: []string{"--load-mode", "psychic"}, wantErr: "psychic"},
		{name: "stray argument", args: []string{"extra"}, wantErr: "unexpected argument"},
	}
	runParseCases(t, cases)
}

// parseCase is one `kvgate serve` command line and what parsing it must give.
type parseCase struct {
	name    string
	args    []string
	wantErr string                              // a substring of the expected error
	check   func(t *testing.T, o *serveOptions) // when no error is expected
}

func runParseCases(t *testing.T, cases []parseCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseServe(tc.args, io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, o)
		})
	}
}

// TestServeBuiltinFleet starts the gateway as `kvgate` with no workers does, on loopback, and
// asks it a question with the OpenAI SDK; then cancels and expects a clean exit.
func TestServeBuiltinFleet(t *testing.T) {
	o, err := parseServe([]string{"--host", "127.0.0.1", "--port", "0", "--prometheus-port", "0", "--admin-port", "0", "--sim-workers", "2"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	addrs, stop := startServe(t, o, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	c := openai.NewClient(option.WithBaseURL("http://"+addrs.api+"/v1/"), option.WithAPIKey("x"), option.WithMaxRetries(0))
	resp, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:     "kvgate-sim",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")},
		MaxTokens: openai.Int(4),
	})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Usage.CompletionTokens != 4 || resp.Choices[0].Message.Content == "" {
		t.Errorf("response %+v", resp)
	}
	if err := stop(); err != nil {
		t.Fatalf("serve returned %v", err)
	}
}

// startServe runs serve with o, logging to log, until stop (which returns serve's error);
// it fails the test if the gateway does not start.
func startServe(t *testing.T, o *serveOptions, log *slog.Logger) (addrs listenAddrs, stop func() error) {
	t.Helper()
	o.gw.Logger = log
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan listenAddrs, 1)
	done := make(chan error, 1)
	go func() { done <- serve(ctx, o, log, ready) }()
	select {
	case addrs = <-ready:
	case err := <-done:
		cancel()
		t.Fatal(err)
	case <-time.After(20 * time.Second):
		cancel()
		t.Fatal("the gateway did not start")
	}
	return addrs, func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(20 * time.Second):
			t.Fatal("the gateway did not stop")
			return nil
		}
	}
}

func TestJoinMultiValues(t *testing.T) {
	got := joinMultiValues([]string{"--worker-urls", "a", "b", "--port", "1", "--decode", "c", "-prefill=x"})
	want := []string{"--worker-urls=a,b", "--port", "1", "--decode=c", "-prefill=x"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}
