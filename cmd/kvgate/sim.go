package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/kvgate/kvgate/internal/sim"
)

// runSim serves simulated engines (package sim) on real ports until ctx is done: --count
// engines on --host, ports --base-port, --base-port+1, …, each with the cost model and faults
// the flags give (faults only on --fault-engines when set). It prints one URL per line.
func runSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	flags := sim.RegisterFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("sim: unexpected arguments %q", fs.Args())
	}
	cfg, faults, faulty, err := flags.Config()
	if err != nil {
		return err
	}
	fleet, err := sim.StartFleet(ctx, flags.Count, flags.Host, flags.BasePort, cfg)
	if err != nil {
		return err
	}
	defer fleet.Close()
	if faults != (sim.Faults{ErrorStatus: faults.ErrorStatus}) {
		servers := fleet.Servers()
		for _, i := range faulty {
			servers[i].SetFaults(faults)
		}
		fmt.Fprintf(stderr, "kvgate sim: faults %+v on engines %v\n", faults, faulty)
	}
	fmt.Fprintf(stderr, "kvgate sim: %d %s engine(s) serving model %q\n", flags.Count, cfg.Flavor, cfg.Model)
	for _, u := range fleet.URLs() {
		fmt.Fprintln(stdout, u)
	}
	<-ctx.Done()
	return nil
}
