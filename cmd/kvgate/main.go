// Command kvgate is an OpenAI-compatible gateway for fleets of LLM inference servers.
//
// Usage:
//
//	kvgate [serve] [flags]   run the gateway (the default)
//	kvgate sim [flags]       serve simulated inference engines on real ports
//	kvgate bench [flags]     drive workloads against a URL or a virtual-time fleet
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "kvgate:", err)
		os.Exit(2)
	}
}

// run dispatches to a subcommand; with none (or a leading flag) it serves.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := "serve"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		return runServe(ctx, args, stdout, stderr)
	case "sim":
		return runSim(ctx, args, stdout, stderr)
	case "bench":
		return runBench(ctx, args, stdout, stderr)
	case "help":
		fmt.Fprintln(stdout, "usage: kvgate [serve|sim|bench] [flags]; kvgate CMD -h for a command's flags")
		return nil
	}
	return fmt.Errorf("unknown command %q (want serve, sim or bench)", cmd)
}
