// Command kvgate is an OpenAI-compatible gateway for fleets of LLM inference servers.
//
// Usage:
//
//	kvgate [serve] [flags]   run the gateway (the default)
//	kvgate sim [flags]       serve simulated inference engines on real ports
//	kvgate bench [flags]     drive workloads against a URL or a virtual-time fleet
//	kvgate version           print the version and VCS revision (also --version)
//	kvgate help [command]    list the commands, or one command's flags (also -h)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
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
