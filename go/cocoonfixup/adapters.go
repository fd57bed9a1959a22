package cocoonfixup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"syscall"
	"time"
)

// StreamVM is a VM (and a RecordInspector) made of a runtime's own calls
// in the shape cocoon clients commonly give them: an exec that streams
// the command's output and reports a non-zero exit as an error, and an
// inspect that returns the caller's typed record. Run then needs no
// adapter of the caller's own.
type StreamVM struct {
	// Stream runs argv in vm (`cocoon vm exec`), writing the command's
	// standard output and error to stdout and stderr, until ctx ends. A
	// command that ran and exited non-zero is an error with an
	// ExitCode() int or ExitStatus() int method (an *exec.ExitError, or
	// k8s.io/utils/exec's CodeExitError); any other error is one the
	// command could not run by. A command ended by a signal is told only
	// by an error that unwraps to *exec.ExitError: an exit status below
	// zero names no signal, so the step takes it as an exec that failed
	// (without the grace a service stop's signal gets).
	Stream func(ctx context.Context, vm string, argv []string, stdout, stderr io.Writer) error
	// Record returns the VM's record as the caller's runtime parsed it,
	// filled into a VMRecord; a fact it does not give is left empty, and
	// the step never guesses it (see RecordInspector). Its error matches
	// ErrVMGone when the VM does not exist, and may keep its own error
	// (VMGone(err) does both).
	Record func(ctx context.Context, vm string) (*VMRecord, error)
}

// Inspect is the record as JSON, for a caller that asks it directly.
func (v StreamVM) Inspect(ctx context.Context, vm string, timeout time.Duration) ([]byte, error) {
	record, err := v.InspectRecord(ctx, vm, timeout)
	if err != nil {
		return nil, err
	}
	return document(record)
}

// InspectRecord calls Record within timeout.
func (v StreamVM) InspectRecord(ctx context.Context, vm string, timeout time.Duration) (*VMRecord, error) {
	if v.Record == nil {
		return nil, invalid("StreamVM has no Record")
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return v.Record(ctx, vm)
}

// Exec calls Stream within timeout and keeps the last 64 KiB of each
// output, saying whether earlier bytes of standard error were cut.
func (v StreamVM) Exec(ctx context.Context, vm string, argv []string, timeout time.Duration) (ExecResult, error) {
	if v.Stream == nil {
		return ExecResult{}, invalid("StreamVM has no Stream")
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var stdout, stderr tailBuffer
	err := v.Stream(ctx, vm, argv, &stdout, &stderr)
	res := ExecResult{Stdout: stdout.bytes(), Stderr: stderr.bytes(), StderrCut: stderr.cut}
	if err == nil {
		return res, nil
	}
	if ctx.Err() == nil {
		if signal, ok := signalOf(err); ok {
			res.Signal = signal
			return res, nil
		}
		if code, ok := exitCode(err); ok {
			res.ExitCode = code
			return res, nil
		}
	}
	if ctx.Err() != nil {
		return res, fmt.Errorf("the exec did not end within %v: %w", timeout, err)
	}
	return res, err
}

// exitCode is the exit status an error of a command that ran carries.
func exitCode(err error) (int, bool) {
	var code interface{ ExitCode() int }
	if errors.As(err, &code) && code.ExitCode() >= 0 {
		return code.ExitCode(), true
	}
	var status interface{ ExitStatus() int }
	if errors.As(err, &status) && status.ExitStatus() >= 0 {
		return status.ExitStatus(), true
	}
	return 0, false
}

// signalOf is the signal that ended a command that ran, when one did.
func signalOf(err error) (int, bool) {
	var state interface{ Sys() any }
	if !errors.As(err, &state) {
		return 0, false
	}
	ws, ok := state.Sys().(interface {
		Signaled() bool
		Signal() syscall.Signal
	})
	if !ok || !ws.Signaled() {
		return 0, false
	}
	return int(ws.Signal()), true
}

// tailBuffer keeps the last outputMax bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	cut bool
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(p)
	if len(p) > outputMax {
		p = p[len(p)-outputMax:]
		t.cut = true
	}
	if over := t.buf.Len() + len(p) - outputMax; over > 0 {
		t.buf.Next(over)
		t.cut = true
	}
	t.buf.Write(p)
	return n, nil
}

func (t *tailBuffer) bytes() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]byte(nil), t.buf.Bytes()...)
}
