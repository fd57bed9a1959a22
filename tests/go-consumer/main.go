// Command go-consumer uses the Go package as a daemon does that is built
// with CGO_ENABLED=0 for release and tested with `go test -race` (cgo on):
// one Planner on the backend its build gives. It prints that backend and
// how the step handled a plain pod. host/capi/tests/consumer.rs builds it
// each way such a daemon is built.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/cocoonstack/cocoon-fixup/go/cocoonfixup"
)

// plainPod is a pod that is no clone of a cocoon VM, as the API server
// returns it.
const plainPod = `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web","namespace":"default","uid":"4f7c1a2e","resourceVersion":"1"}}`

// open builds the daemon's Planner: the binary is Options.Binary, else
// COCOON_FIXUP_BIN, else cocoon-fixup on PATH.
func open(ctx context.Context, binary string) (*cocoonfixup.Planner, error) {
	return cocoonfixup.NewPlanner(ctx, cocoonfixup.Options{Binary: binary, NoPluginDir: true, NoCache: true})
}

// handle runs the step for the plain pod, which the library leaves alone
// from the pod alone: it asks nothing of the cocoon or the API server.
func handle(ctx context.Context, p *cocoonfixup.Planner) (*cocoonfixup.Outcome, error) {
	return p.Run(ctx, []byte(plainPod), nobody{}, nobody{}, cocoonfixup.RunOptions{})
}

// errAsked is what nobody answers every call with.
var errAsked = errors.New("go-consumer: the step asked for nothing for a plain pod")

// nobody is a cocoon and an API server that fail every call.
type nobody struct{}

func (nobody) Inspect(ctx context.Context, vm string, timeout time.Duration) ([]byte, error) {
	return nil, errAsked
}

func (nobody) Exec(ctx context.Context, vm string, argv []string, timeout time.Duration) (cocoonfixup.ExecResult, error) {
	return cocoonfixup.ExecResult{}, errAsked
}

func (nobody) Get(ctx context.Context, namespace, name string) ([]byte, error) { return nil, errAsked }

func (nobody) PatchAnnotations(ctx context.Context, namespace, name string, p cocoonfixup.PodPatch) ([]byte, error) {
	return nil, errAsked
}

func (nobody) Event(ctx context.Context, namespace, name, uid string, e cocoonfixup.Event) error {
	return errAsked
}

func main() {
	ctx := context.Background()
	p, err := open(ctx, "")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer p.Close()
	out, err := handle(ctx, p)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(p.Backend(), out.Action, out.HandsOff)
}
