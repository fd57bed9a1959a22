package cocoonfixup

import (
	"context"
	"errors"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// shell streams `sh -c argv[0]` as a runtime's exec would.
func shell(ctx context.Context, vm string, argv []string, stdout, stderr io.Writer) error {
	cmd := exec.CommandContext(ctx, "sh", "-c", argv[0])
	cmd.Stdout, cmd.Stderr = stdout, stderr
	return cmd.Run()
}

// StreamVM turns a streaming exec into Run's results: the exit code, the
// signal, the output's last 64 KiB, a timeout as an error.
func TestStreamVMExec(t *testing.T) {
	v := StreamVM{Stream: shell}
	res, err := v.Exec(context.Background(), "vm-1", []string{"echo out; echo err >&2; exit 3"}, time.Minute)
	if err != nil || res.ExitCode != 3 || string(res.Stdout) != "out\n" || string(res.Stderr) != "err\n" || res.StderrCut {
		t.Errorf("exit 3: %+v %v", res, err)
	}
	res, err = v.Exec(context.Background(), "vm-1", []string{"kill -TERM $$"}, time.Minute)
	if err != nil || res.Signal != 15 {
		t.Errorf("killed by SIGTERM: %+v %v", res, err)
	}
	res, err = v.Exec(context.Background(), "vm-1", []string{"head -c 100000 /dev/zero | tr '\\0' x >&2; printf END >&2"}, time.Minute)
	if err != nil || len(res.Stderr) != outputMax || !res.StderrCut || !strings.HasSuffix(string(res.Stderr), "xEND") {
		t.Errorf("100 kB of stderr: %d bytes kept, cut %v, %v", len(res.Stderr), res.StderrCut, err)
	}
	_, err = v.Exec(context.Background(), "vm-1", []string{"exec sleep 5"}, 100*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "did not end within 100ms") {
		t.Errorf("an exec past its timeout: %v", err)
	}
	notThere := errors.New("exec: \"cocoon\": executable file not found")
	res, err = StreamVM{Stream: func(context.Context, string, []string, io.Writer, io.Writer) error { return notThere }}.Exec(context.Background(), "vm-1", nil, time.Minute)
	if !errors.Is(err, notThere) {
		t.Errorf("an exec that could not run: %+v %v", res, err)
	}
}

// StreamVM's record is the caller's, within the timeout; a gone VM stays
// the caller's error; a missing call is refused, never a panic.
func TestStreamVMRecord(t *testing.T) {
	v := StreamVM{Record: func(ctx context.Context, vm string) (*VMRecord, error) {
		if vm == "gone" {
			return nil, VMGone(errors.New("vm not found"))
		}
		if _, ok := ctx.Deadline(); !ok {
			t.Error("the record was asked without the timeout")
		}
		return &VMRecord{ID: vm, Config: VMConfig{Name: "vk-a-b-0"}}, nil
	}}
	doc, err := v.Inspect(context.Background(), "vm-1", time.Second)
	if err != nil || !strings.Contains(string(doc), `"id":"vm-1"`) {
		t.Errorf("the record as JSON: %s %v", doc, err)
	}
	if _, err := v.InspectRecord(context.Background(), "gone", time.Second); !errors.Is(err, ErrVMGone) {
		t.Errorf("a gone VM: %v", err)
	}
	if _, err := (StreamVM{}).Exec(context.Background(), "vm-1", nil, time.Second); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("no Stream: %v", err)
	}
	if _, err := (StreamVM{}).InspectRecord(context.Background(), "vm-1", time.Second); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("no Record: %v", err)
	}
}
