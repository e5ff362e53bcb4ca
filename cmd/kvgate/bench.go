package main

import (
	"context"
	"errors"
	"io"
)

// runBench runs the bench rig. (Being written in the bench-rig change.)
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("bench: not built yet")
}
