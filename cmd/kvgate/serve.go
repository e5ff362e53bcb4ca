package main

import (
	"context"
	"errors"
	"io"
)

// runServe runs the gateway. (Being written in the gateway-core change.)
func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("serve: not built yet")
}
