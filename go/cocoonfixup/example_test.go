package cocoonfixup_test

import (
	"context"
	"errors"
	"fmt"
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
