// Command go-consumer uses the Go package as a daemon does that is built
// with CGO_ENABLED=0 for release and tested with `go test -race` (cgo on):
// one Planner on the backend its build gives. It prints that backend and
// the gate's answer for a plain pod. host/capi/tests/consumer.rs builds
// it each way such a daemon is built.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/cocoonstack/cocoon-fixup/go/cocoonfixup"
)

// plainPod is a pod that is no clone of a cocoon VM.
const plainPod = `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web","namespace":"default","uid":"4f7c1a2e"}}`

// open builds the daemon's Planner: the binary is Options.Binary, else
// COCOON_FIXUP_BIN, else cocoon-fixup on PATH.
func open(ctx context.Context, binary string) (*cocoonfixup.Planner, error) {
	return cocoonfixup.NewPlanner(ctx, cocoonfixup.Options{Binary: binary, NoPluginDir: true, NoCache: true})
}

func main() {
	ctx := context.Background()
	p, err := open(ctx, "")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer p.Close()
	d, err := p.Gate(ctx, []byte(plainPod))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(p.Backend(), d.Action, d.Why)
}
