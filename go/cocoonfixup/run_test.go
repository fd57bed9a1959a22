package cocoonfixup

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// LeaseFile, Run's default Leases, looks at cocoon-net's lease file
// through the library as the daemon's watcher does: no file yet holds no
// lease; a lease, none, and files that cannot tell.
func TestLeaseFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "leases.json")
	p, err := NewPlanner(ctx, Options{LeaseFile: file, NoPluginDir: true, CacheDir: filepath.Join(dir, "cache"), CacheKey: filepath.Join(dir, "key")})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	leases := p.LeaseFile()
	if ip, err := leases.Lease(ctx, "52:54:00:aa:bb:01"); err != nil || ip != "" {
		t.Errorf("no file yet: %q %v", ip, err)
	}
	// A FIFO would block a reader until a writer came.
	if err := syscall.Mkfifo(file, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := leases.Lease(ctx, "52:54:00:aa:bb:01"); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a FIFO: %v", err)
	}
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := leases.Lease(ctx, "52:54:00:aa:bb:01"); err == nil || !strings.Contains(err.Error(), "not a JSON array") {
		t.Errorf("not a list: %v", err)
	}
	rows := `[{"mac": "52:54:00:aa:bb:01", "ip": "10.0.0.9", "expiry": "2999-01-01T00:00:00Z"}]`
	if err := os.WriteFile(file, []byte(rows), 0o644); err != nil {
		t.Fatal(err)
	}
	if ip, err := leases.Lease(ctx, "52:54:00:AA:BB:01"); err != nil || ip != "10.0.0.9" {
		t.Errorf("a lease: %q %v", ip, err)
	}
	if ip, err := leases.Lease(ctx, "52:54:00:aa:bb:02"); err != nil || ip != "" {
		t.Errorf("no lease: %q %v", ip, err)
	}
}

// A BackendProcess child that dies is replaced when a call next needs
// it: the Run whose task lived in it ends ErrUnavailable (retryable), the
// next calls reach a new child with the planner made again, and a child
// that dies again within the pause is not started again at once.
func TestADeadChildIsReplaced(t *testing.T) {
	dir := t.TempDir()
	p, err := NewPlanner(ctx, Options{Backend: BackendProcess, NoPluginDir: true,
		CocoonRoot: filepath.Join(root, "examples", "cocoon-root"),
		CacheDir:   filepath.Join(dir, "cache"), CacheKey: filepath.Join(dir, "key")})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	child := func() *process {
		p.connMu.Lock()
		defer p.connMu.Unlock()
		return p.conn.t.(*process)
	}
	kill := func() {
		c := child()
		c.cmd.Process.Kill()
		<-c.done
	}
	// The pause between starts is made to have passed.
	pastPause := func() {
		p.connMu.Lock()
		p.restarted = time.Time{}
		p.connMu.Unlock()
	}
	pod, _ := os.ReadFile(filepath.Join(root, "examples", "no-fixup", "pod.json"))
	vm, _ := os.ReadFile(filepath.Join(root, "examples", "no-fixup", "vm.json"))
	first := child().cmd.Process.Pid

	_, err = p.Run(ctx, pod, stillVM{vm}, stillPods{pod}, RunOptions{Leases: leaseThen(kill)})
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, ErrRetryable) {
		t.Fatalf("a Run whose child died: %v", err)
	}
	pastPause()
	if _, err := p.Plan(ctx, pod, vm, Overrides{}); err != nil {
		t.Fatalf("a Plan in the second child: %v", err)
	}
	kill()
	pastPause()
	if _, err := p.Plan(ctx, pod, vm, Overrides{}); err != nil {
		t.Fatalf("a Plan after the child died: %v", err)
	}
	if second := child().cmd.Process.Pid; second == first {
		t.Fatalf("the same child %d answered", second)
	}
	out, err := p.Run(ctx, pod, stillVM{vm}, stillPods{pod}, RunOptions{Leases: leaseThen(func() {})})
	if err != nil || out.Readiness != "ready" {
		t.Fatalf("a Run on the new child: %+v %v", out, err)
	}

	p.connMu.Lock()
	p.pause = time.Hour
	p.connMu.Unlock()
	kill()
	if _, err := p.Plan(ctx, pod, vm, Overrides{}); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "child is gone") {
		t.Fatalf("within the pause: %v", err)
	}
}

type stillVM struct{ record []byte }

func (v stillVM) Inspect(ctx context.Context, vm string, timeout time.Duration) ([]byte, error) {
	return v.record, nil
}

func (v stillVM) Exec(ctx context.Context, vm string, argv []string, timeout time.Duration) (ExecResult, error) {
	return ExecResult{}, nil
}

// stillPods holds one pod that no write changes.
type stillPods struct{ pod []byte }

func (s stillPods) Get(ctx context.Context, namespace, name string) ([]byte, error) {
	return s.pod, nil
}

func (s stillPods) PatchAnnotations(ctx context.Context, namespace, name string, p PodPatch) ([]byte, error) {
	return nil, nil
}

func (s stillPods) Event(ctx context.Context, namespace, name, uid string, e Event) error { return nil }

// recordingPods is stillPods that keeps what was written: each patch's
// annotations and each event.
type recordingPods struct {
	stillPods
	mu      sync.Mutex
	patches []Patch
	events  []Event
}

func (r *recordingPods) PatchAnnotations(ctx context.Context, namespace, name string, p PodPatch) ([]byte, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.patches = append(r.patches, p.Annotations)
	return nil, nil
}

func (r *recordingPods) Event(ctx context.Context, namespace, name, uid string, e Event) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
	return nil
}

// last is the last value written to key ("" for none, or removed).
func (r *recordingPods) last(key string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	value := ""
	for _, p := range r.patches {
		if v, ok := p[key]; ok {
			value = deref(v)
		}
	}
	return value
}

// leaseThen runs then, and leases an address.
type leaseThen func()

func (l leaseThen) Lease(ctx context.Context, mac string) (string, error) {
	l()
	return "10.88.9.7", nil
}

// Close is a shutdown for the Runs in flight: an exec under way is
// cancelled, the fixup ends `shutdown` with nothing marked failed, and
// Close returns once the Run has.
func TestCloseCancelsTheRunsInFlight(t *testing.T) {
	for _, backend := range backends(t) {
		p := examplesPlanner(t, backend)
		pod, vm := exampleFiles(t, "oci-static")
		execing := make(chan struct{})
		var returned atomic.Bool
		type ended struct {
			out *Outcome
			err error
		}
		done := make(chan ended, 1)
		go func() {
			out, err := p.Run(context.Background(), pod, blockedVM{vm, execing, &returned}, stillPods{pod}, RunOptions{})
			done <- ended{out, err}
		}()
		<-execing
		if err := p.Close(); err != nil {
			t.Errorf("%s: Close: %v", backend, err)
		}
		// The exec returned before the Run counted itself out.
		if !returned.Load() {
			t.Errorf("%s: Close returned while the Run was in its exec", backend)
		}
		select {
		case e := <-done:
			if e.err != nil || e.out.Fixup != "shutdown" {
				t.Errorf("%s: the Run ended %+v %v, want a shutdown", backend, e.out, e.err)
			}
		case <-time.After(60 * time.Second):
			t.Errorf("%s: the Run did not end after Close", backend)
		}
	}
}

// blockedVM's exec says it started, then holds until its context ends,
// and says it returned.
type blockedVM struct {
	record   []byte
	started  chan struct{}
	returned *atomic.Bool
}

func (v blockedVM) Inspect(ctx context.Context, vm string, timeout time.Duration) ([]byte, error) {
	return v.record, nil
}

func (v blockedVM) Exec(ctx context.Context, vm string, argv []string, timeout time.Duration) (ExecResult, error) {
	close(v.started)
	<-ctx.Done()
	v.returned.Store(true)
	return ExecResult{}, ctx.Err()
}

// A new child that never answers holds no caller past its context, and
// Close ends the start under way: neither waits for the child.
func TestAHangingRestartHoldsNobody(t *testing.T) {
	dir := t.TempDir()
	var logged []string
	var mu sync.Mutex
	p, err := NewPlanner(ctx, Options{Backend: BackendProcess, NoPluginDir: true,
		CocoonRoot: filepath.Join(root, "examples", "cocoon-root"),
		CacheDir:   filepath.Join(dir, "cache"), CacheKey: filepath.Join(dir, "key"),
		Log: func(level, message string) {
			mu.Lock()
			defer mu.Unlock()
			logged = append(logged, level+": "+message)
		}})
	if err != nil {
		t.Fatal(err)
	}
	hang := filepath.Join(dir, "hang")
	if err := os.WriteFile(hang, []byte("#!/bin/sh\nexec sleep 1000\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	p.opts.Binary = hang
	p.connMu.Lock()
	old := p.conn.t.(*process)
	p.connMu.Unlock()
	old.cmd.Process.Kill()
	<-old.done
	pod, _ := os.ReadFile(filepath.Join(root, "examples", "no-fixup", "pod.json"))
	vm, _ := os.ReadFile(filepath.Join(root, "examples", "no-fixup", "vm.json"))
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := p.Plan(short, pod, vm, Overrides{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a Plan while the new child hangs: %v", err)
	}
	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close waited for the hanging child")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(logged) != 2 || !strings.HasPrefix(logged[0], "warn: the cocoon-fixup child is gone") ||
		!strings.Contains(logged[1], "a new child did not start") {
		t.Errorf("logged: %q", logged)
	}
}
