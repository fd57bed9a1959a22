package guesttest_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cocoonstack/cocoon-fixup/go/cocoonfixup"
	"github.com/cocoonstack/cocoon-fixup/go/cocoonfixup/guesttest"
)

var examples = filepath.Join("..", "..", "..", "examples")

// guest answers every exec with answer.
type guest struct {
	record []byte
	answer func(argv []string) cocoonfixup.ExecResult
}

func (g guest) Inspect(ctx context.Context, vm string, timeout time.Duration) ([]byte, error) {
	return g.record, nil
}

func (g guest) Exec(ctx context.Context, vm string, argv []string, timeout time.Duration) (cocoonfixup.ExecResult, error) {
	return g.answer(argv), nil
}

// pods holds one pod that no write changes.
type pods struct{ pod []byte }

func (p pods) Get(ctx context.Context, namespace, name string) ([]byte, error) { return p.pod, nil }

func (p pods) PatchAnnotations(ctx context.Context, namespace, name string, patch cocoonfixup.PodPatch) ([]byte, error) {
	return nil, nil
}

func (p pods) Event(ctx context.Context, namespace, name, uid string, e cocoonfixup.Event) error {
	return nil
}

type leases struct{}

func (leases) Lease(ctx context.Context, mac string) (string, error) { return "10.88.9.7", nil }

// The library itself judges what the stand-in guest writes: every step
// done is a done fixup; a failed step is a failed attempt naming it.
func TestTheLibraryJudgesTheAnswers(t *testing.T) {
	if os.Getenv("COCOON_FIXUP_BIN") == "" {
		t.Skip("COCOON_FIXUP_BIN names no cocoon-fixup binary (`cargo test -p fixup-capi --test go` sets it)")
	}
	ctx := context.Background()
	p, err := cocoonfixup.NewPlanner(ctx, cocoonfixup.Options{Backend: cocoonfixup.BackendProcess,
		CocoonRoot: filepath.Join(examples, "cocoon-root"), NoPluginDir: true, NoCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, example := range []string{"oci-static", "fc-dhcp", "cloudimg-static"} {
		pod, err := os.ReadFile(filepath.Join(examples, example, "pod.json"))
		if err != nil {
			t.Fatal(err)
		}
		vm, err := os.ReadFile(filepath.Join(examples, example, "vm.json"))
		if err != nil {
			t.Fatal(err)
		}
		out, err := p.Run(ctx, pod, guest{vm, guesttest.Done}, pods{pod}, cocoonfixup.RunOptions{Leases: leases{}})
		if err != nil || out.Fixup != cocoonfixup.FixupDone || out.Attempts != 1 {
			t.Errorf("%s, every step done: %+v %v", example, out, err)
		}
		short := cocoonfixup.Settings{RetryBudget: 200 * time.Millisecond, RetryInterval: 10 * time.Millisecond}
		failing := func(argv []string) cocoonfixup.ExecResult {
			return guesttest.Answer(argv, 1, 5, "stand-in: No space left on device")
		}
		out, err = p.Run(ctx, pod, guest{vm, failing}, pods{pod}, cocoonfixup.RunOptions{Settings: short})
		if err != nil || out.Fixup != cocoonfixup.FixupExhausted || len(out.Errors) == 0 ||
			!strings.Contains(out.Errors[0], "No space left on device") {
			t.Errorf("%s, the first step failed: %+v %v", example, out, err)
		}
	}
}
