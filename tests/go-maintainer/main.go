// Command maintainer is a Go program as a virtual-kubelet provider's
// maintainer writes it against cocoonfixup, with nothing of the package's
// own example: its runtime (package vm) runs the cocoon CLI and gives a
// typed VM and a streaming exec, its provider (package provider) adapts
// them with cocoonfixup.StreamVM, reads and writes pods over the API
// server's REST with net/http, and owns the lifecycle keys through its
// intent table. The host's tests run it beside `cocoon-fixup run` on the
// same inputs and compare what each wrote.
//
// By default it runs the post-clone step for one pod whose VM it has just
// booted (-boot, create unless told otherwise); with -startup, for every
// pod on its node, as after its own restart, the library deciding which
// have work. SIGTERM or SIGINT stops it as a service is stopped: the step
// under way is left for the next start, which resumes it from the records
// kept in -state-dir. Otherwise it then reconciles its intent table once.
// It prints one JSON line per status it publishes (its stand-in for the
// pod's status), per pod the step had work for, and for the reconcile.
//
//	maintainer -server URL -cocoon PATH [-state-dir DIR] -namespace NS -pod NAME [-boot create] [-source-image IMAGE] [-node N -accept-annotated]
//	maintainer -server URL -cocoon PATH [-state-dir DIR] -node N -startup
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"example.com/maintainer/provider"
	"example.com/maintainer/vm"
	"github.com/cocoonstack/cocoon-fixup/go/cocoonfixup"
)

// output prints JSON lines, one at a time.
type output struct{ mu sync.Mutex }

func (o *output) line(v any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	b, err := json.Marshal(v)
	if err != nil {
		fmt.Fprintln(os.Stderr, "maintainer: encoding output:", err)
		return
	}
	fmt.Println(string(b))
}

// PublishStatus prints the status: the stand-in for UpdatePodStatus.
func (o *output) PublishStatus(ctx context.Context, s provider.PodStatus) error {
	o.line(map[string]any{"status": s})
	return nil
}

func (o *output) result(namespace, name string, out *cocoonfixup.Outcome, err error) {
	line := map[string]any{"pod": namespace + "/" + name}
	if out != nil {
		line["outcome"] = out
	}
	var stop *cocoonfixup.StopError
	switch {
	case errors.As(err, &stop):
		line["stopped"] = map[string]any{"kind": stop.Kind, "retryable": stop.Retryable, "message": stop.Message}
	case err != nil:
		line["error"] = err.Error()
	}
	o.line(line)
}

func main() { os.Exit(run()) }

// run is the program; its result is the exit code: 0, or 1 when a step
// stopped or something could not be done.
func run() int {
	server := flag.String("server", "", "the API server's URL")
	namespace := flag.String("namespace", "default", "the pod's namespace")
	name := flag.String("pod", "", "the pod's name")
	cocoon := flag.String("cocoon", "cocoon", "the cocoon CLI")
	root := flag.String("cocoon-root", "/var/lib/cocoon", "cocoon's state directory")
	leases := flag.String("lease-file", "", "cocoon-net's lease file")
	node := flag.String("node", "", "this node's name")
	annotated := flag.Bool("accept-annotated", false, "bind VMs named by vm.cocoonstack.io/name (the retired webhook's slots)")
	budget := flag.Duration("retry-budget", 0, "fixup attempts stop this long after the first (0: the library's 180s)")
	interval := flag.Duration("retry-interval", 0, "between fixup attempts (0: the library's 3s)")
	boot := flag.String("boot", string(cocoonfixup.BootCreate), "how the provider booted the pod's VM: create, fork, wake, wake-in-place, resume, or \"\" for unknown")
	source := flag.String("source-image", "", "the source image of the snapshot the VM was cloned from (\"\": unknown)")
	startup := flag.Bool("startup", false, "run the step for every pod on -node, as after a restart, instead of -pod")
	state := flag.String("state-dir", "", "where the pods' records are kept across restarts (\"\": none)")
	flag.Parse()

	// SIGTERM or SIGINT is a stop: the step under way is abandoned,
	// nothing is marked failed, and the next start resumes it.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "maintainer: "+format+"\n", args...)
		return 1
	}
	planner, err := cocoonfixup.NewPlanner(ctx, cocoonfixup.Options{
		CocoonRoot: *root, LeaseFile: *leases, NoPluginDir: true, NoCache: true,
		AcceptAnnotatedVMNames: *annotated,
	})
	if err != nil {
		return fail("%v", err)
	}
	defer planner.Close()

	out := &output{}
	api := &provider.APIServer{Base: *server, Node: *node, Controller: "maintainer"}
	p := &provider.Provider{
		Planner:     planner,
		Runtime:     vm.CLI{Binary: *cocoon},
		API:         api,
		Lifecycle:   &provider.Lifecycle{Pods: api, Status: out},
		Settings:    cocoonfixup.Settings{RetryBudget: *budget, RetryInterval: *interval},
		SourceImage: *source,
		Log: func(level, message string) {
			fmt.Fprintf(os.Stderr, "maintainer: %s: %s\n", level, message)
		},
	}
	if *state != "" {
		p.Records = provider.Records{Dir: *state}
	}

	failed := false
	if *startup {
		results, err := p.StartupReconcile(ctx)
		for _, r := range results {
			out.result(r.Namespace, r.Name, r.Outcome, r.Err)
			failed = failed || r.Err != nil
		}
		if err != nil {
			return fail("startup: %v", err)
		}
	} else {
		pod, err := api.Get(ctx, *namespace, *name)
		if err != nil {
			return fail("reading the pod %s/%s: %v", *namespace, *name, err)
		}
		if pod == nil {
			return fail("the pod %s/%s is not found", *namespace, *name)
		}
		outcome, err := p.PostClone(ctx, pod, cocoonfixup.Boot(*boot))
		out.result(*namespace, *name, outcome, err)
		if err != nil && ctx.Err() == nil {
			// Reconciled all the same: what was published stays so.
			fmt.Fprintln(os.Stderr, "maintainer:", err)
			failed = true
		}
	}
	if ctx.Err() != nil {
		// Stopped: what was left is resumed at the next start.
		out.line(map[string]any{"shutdown": true})
		return 0
	}
	republished, err := p.Lifecycle.Reconcile(ctx)
	out.line(map[string]any{"reconcile": map[string]any{"republished": republished}})
	if err != nil {
		return fail("reconcile: %v", err)
	}
	if failed {
		return 1
	}
	return 0
}
