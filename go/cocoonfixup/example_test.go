package cocoonfixup_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/cocoonstack/cocoon-fixup/go/cocoonfixup"
)

// examples is the repository's bundled examples, from this package.
var examples = filepath.Join("..", "..", "examples")

// guest is a stand-in cocoon whose VM answers every plan as done.
type guest struct{ record []byte }

func (g guest) Inspect(ctx context.Context, vm string, timeout time.Duration) ([]byte, error) {
	return g.record, nil
}

func (g guest) Exec(ctx context.Context, vm string, argv []string, timeout time.Duration) (cocoonfixup.ExecResult, error) {
	// A plan of one run step runs directly and is judged by its exit code.
	return cocoonfixup.ExecResult{}, nil
}

// api is a stand-in API server holding one pod.
type api struct{ pod []byte }

func (a *api) Get(ctx context.Context, namespace, name string) ([]byte, error) { return a.pod, nil }

func (a *api) PatchAnnotations(ctx context.Context, namespace, name string, p cocoonfixup.PodPatch) ([]byte, error) {
	for key, value := range p.Annotations {
		if key == cocoonfixup.KeyLifecycleState && value != nil {
			fmt.Printf("%s=%s\n", key, *value)
		}
	}
	return nil, nil
}

func (a *api) Event(ctx context.Context, namespace, name, uid string, e cocoonfixup.Event) error {
	fmt.Println("event", e.Reason)
	return nil
}

// Run carries out the whole post-clone step for one pod: here a Cloud
// Hypervisor clone on DHCP that needs no fixup, so the step is the IP
// wait and the ready write.
func ExamplePlanner_Run() {
	ctx := context.Background()
	planner, err := cocoonfixup.NewPlanner(ctx, cocoonfixup.Options{
		CocoonRoot: filepath.Join(examples, "cocoon-root"), NoPluginDir: true,
		NoCache: true,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer planner.Close()
	pod, _ := os.ReadFile(filepath.Join(examples, "no-fixup", "pod.json"))
	vm, _ := os.ReadFile(filepath.Join(examples, "no-fixup", "vm.json"))
	out, err := planner.Run(ctx, pod, guest{vm}, &api{pod}, cocoonfixup.RunOptions{Leases: leases{}})
	switch {
	case errors.Is(err, cocoonfixup.ErrRetryable):
		fmt.Println("try the pod again later:", err)
	case err != nil:
		fmt.Println(err)
	default:
		fmt.Println(out.Action, out.Readiness, out.IP)
	}
	// Output:
	// vm.cocoonstack.io/lifecycle-state=ready
	// ip-wait ready 10.88.9.7
}

// leases leases one address to every MAC.
type leases struct{}

func (leases) Lease(ctx context.Context, mac string) (string, error) { return "10.88.9.7", nil }

// Errors match the sentinels with errors.Is: a node at fault is retried,
// never a pod failure.
func ExampleError() {
	err := error(&cocoonfixup.Error{Code: cocoonfixup.CodeNode, Message: "a plugin ran past its deadline"})
	fmt.Println(errors.Is(err, cocoonfixup.ErrRetryable), errors.Is(err, cocoonfixup.ErrPlanFailed))
	// Output: true false
}

// examplesPlanner is a planner over the examples' cocoon root, with the
// built-in plugins alone.
func examplesPlanner(ctx context.Context) (*cocoonfixup.Planner, error) {
	return cocoonfixup.NewPlanner(ctx, cocoonfixup.Options{
		CocoonRoot: filepath.Join(examples, "cocoon-root"), NoPluginDir: true, NoCache: true,
	})
}

// owner publishes the lifecycle itself, as a caller with its own intent
// table does.
type owner struct{}

func (owner) Publish(ctx context.Context, pod cocoonfixup.PodRef, i cocoonfixup.LifecycleIntent) error {
	fmt.Printf("publish %s/%s: %s ready=%v ip=%s generation=%s\n", pod.Namespace, pod.Name, i.State, i.Ready, i.IP, i.ObservedGeneration)
	return nil
}

// With RunOptions.Lifecycle the caller owns the lifecycle keys: Run
// writes none of them (the stand-in API server prints any it is asked
// to write) and hands each change over, in order.
func ExampleRunOptions_lifecycle() {
	ctx := context.Background()
	planner, err := examplesPlanner(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer planner.Close()
	pod, _ := os.ReadFile(filepath.Join(examples, "no-fixup", "pod.json"))
	vm, _ := os.ReadFile(filepath.Join(examples, "no-fixup", "vm.json"))
	out, err := planner.Run(ctx, pod, guest{vm}, &api{pod}, cocoonfixup.RunOptions{Leases: leases{}, Lifecycle: owner{}})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(out.Action, out.Readiness)
	// Output:
	// publish apps/api-3: ready ready=true ip=10.88.9.7 generation=3
	// ip-wait ready
}

// StreamVM adapts a runtime whose exec streams output and whose inspect
// returns its own typed VM; the caller says how it booted the VM, so
// nothing waits for the stack's events.
func ExampleStreamVM() {
	ctx := context.Background()
	planner, err := examplesPlanner(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer planner.Close()
	// The runtime's own view of the VM, without the image or the time it
	// was made.
	type runtimeVM struct {
		ID, Name string
		MACs     []string
	}
	own := runtimeVM{ID: "vm-4d7e1a90", Name: "vk-apps-api-3-81ccc5", MACs: []string{"52:54:00:4d:7e:1a", "52:54:00:4d:7e:1b"}}
	vm := cocoonfixup.StreamVM{
		Stream: func(ctx context.Context, vm string, argv []string, stdout, stderr io.Writer) error {
			return errors.New("no exec is needed here")
		},
		Record: func(ctx context.Context, vm string) (*cocoonfixup.VMRecord, error) {
			record := &cocoonfixup.VMRecord{ID: own.ID, Config: cocoonfixup.VMConfig{Name: own.Name}}
			for _, mac := range own.MACs {
				record.NetworkConfigs = append(record.NetworkConfigs, cocoonfixup.VMNetwork{MAC: mac})
			}
			return record, nil
		},
	}
	pod, _ := os.ReadFile(filepath.Join(examples, "no-fixup", "pod.json"))
	out, err := planner.Run(ctx, pod, vm, &api{pod}, cocoonfixup.RunOptions{Leases: leases{}, Boot: cocoonfixup.BootFork})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(out.Action, out.Readiness, out.IP)
	// Output:
	// vm.cocoonstack.io/lifecycle-state=ready
	// ip-wait ready 10.88.9.7
}

// The child-process backend, the default: `cocoon-fixup embed`, found by
// Options.Binary, else COCOON_FIXUP_BIN, else PATH, and checked at start.
func ExampleNewPlanner_process() {
	planner, err := cocoonfixup.NewPlanner(context.Background(), cocoonfixup.Options{
		Backend: cocoonfixup.BackendProcess, Binary: os.Getenv("COCOON_FIXUP_BIN"),
		CocoonRoot: filepath.Join(examples, "cocoon-root"), NoPluginDir: true, NoCache: true,
	})
	if errors.Is(err, cocoonfixup.ErrConfig) {
		fmt.Println("install cocoon-fixup on the node:", err)
		return
	}
	if err != nil {
		fmt.Println(err)
		return
	}
	defer planner.Close()
	fmt.Println(planner.Backend())
	// Output: process
}
