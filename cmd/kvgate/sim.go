package main

import (
	"context"
	"errors"
	"io"
)

// runSim serves simulated engines. (Being written in the engine-simulator change.)
func runSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("sim: not built yet")
}
