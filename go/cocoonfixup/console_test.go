package cocoonfixup

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// heldPod is a stand-in API server holding one pod: patches apply to it,
// with the uid precondition, and each write makes a new resourceVersion.
type heldPod struct {
	mu      sync.Mutex
	doc     map[string]any
	version int
	reasons []string
}

func (h *heldPod) annotations() map[string]any {
	return h.doc["metadata"].(map[string]any)["annotations"].(map[string]any)
}

func (h *heldPod) Get(ctx context.Context, namespace, name string) ([]byte, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return json.Marshal(h.doc)
}

func (h *heldPod) PatchAnnotations(ctx context.Context, namespace, name string, p PodPatch) ([]byte, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	meta := h.doc["metadata"].(map[string]any)
	if p.UID != meta["uid"] {
		return nil, ErrGone
	}
	for key, value := range p.Annotations {
		if value == nil {
			delete(h.annotations(), key)
		} else {
			h.annotations()[key] = *value
		}
	}
	h.version++
	meta["resourceVersion"] = strings.Repeat("1", h.version)
	return json.Marshal(h.doc)
}

func (h *heldPod) Event(ctx context.Context, namespace, name, uid string, e Event) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.reasons = append(h.reasons, e.Reason)
	return nil
}

// The Windows pod's VM in the console tests: one static NIC.
const (
	winVMID = "vm-5ac0ffee"
	// The hashed name of prod/win-0: sha256("prod/win-0")'s first 3 bytes.
	winVMName = "vk-prod-win-0-80319e"
)

var winRecord = []byte(`{"id": "` + winVMID + `", "hypervisor": "cloud-hypervisor", "state": "running",
	"config": {"name": "` + winVMName + `"},
	"network_configs": [{"mac": "52:54:00:5a:c0:01", "tap": "tap0",
		"network": {"ip": "10.88.0.12", "gateway": "10.88.0.1"}}]}`)

// startSim starts the SAC simulator (options, then the interfaces) on
// vmID's console socket below a fresh short root (Unix socket paths are
// short), and waits until it listens: the root, its input (closing it
// ends it) and its output.
func startSim(t *testing.T, sim string, backend Backend, vmID string, args ...string) (string, io.WriteCloser, *bufio.Scanner) {
	root, err := os.MkdirTemp("", "cfsac")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	var flags, nets []string
	for _, a := range args {
		if strings.HasPrefix(a, "--") {
			flags = append(flags, a)
		} else {
			nets = append(nets, a)
		}
	}
	cmd := exec.Command(sim, append(append(flags, root, vmID), nets...)...)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() || lines.Text() != "listening" {
		t.Fatalf("%s: the simulator did not start: %q", backend, lines.Text())
	}
	return root, stdin, lines
}

// windowsPod is prod/win-0, a managed Windows clone on Cloud Hypervisor
// of the VM vmID named name, held by a stand-in API server.
func windowsPod(name, vmID string) *heldPod {
	return &heldPod{doc: map[string]any{"metadata": map[string]any{
		"name": "win-0", "namespace": "prod", "uid": "u-win-0", "resourceVersion": "1",
		"annotations": map[string]any{
			"vm.cocoonstack.io/name": name, "vm.cocoonstack.io/id": vmID,
			"cocoonset.cocoonstack.io/managed": "true", "cocoonset.cocoonstack.io/os": "windows",
			"vm.cocoonstack.io/backend": "cloud-hypervisor",
		}}}}
}

// Run's serial-console pass through the library's own console client
// (the `console_open` and `console_set` ops), against the SAC simulator
// on the VM's console socket below the planner's cocoon root: the static
// NIC's address is set on the first interface (a missing prefix as 24),
// then published.
func TestTheLibrarysConsoleSetsAStaticAddress(t *testing.T) {
	sim := builtBinary(t, "COCOONFIXUP_SAC_SIM", "sac-sim", "cargo build -p fixup-tests --bins")
	for _, backend := range backends(t) {
		root, stdin, lines := startSim(t, sim, backend, winVMID, "7")
		p, err := NewPlanner(ctx, Options{Backend: backend, NoPluginDir: true, CocoonRoot: root, NoCache: true})
		if err != nil {
			t.Fatal(err)
		}
		pods := windowsPod(winVMName, winVMID)
		doc, _ := pods.Get(ctx, "prod", "win-0")
		// No evidence of a wake either way: a short grace.
		out, err := p.Run(ctx, doc, stillVM{winRecord}, pods, RunOptions{Leases: leaseThen(func() {}),
			Settings: Settings{WakeGrace: 100 * time.Millisecond}})
		p.Close()
		stdin.Close()
		var seen struct {
			Received  []string          `json:"received"`
			Addresses map[string]string `json:"addresses"`
		}
		if !lines.Scan() || json.Unmarshal(lines.Bytes(), &seen) != nil {
			t.Fatalf("%s: no report from the simulator: %q", backend, lines.Text())
		}
		if err != nil {
			t.Fatalf("%s: %v", backend, err)
		}
		if out.SAC != "set" || out.IP != "10.88.0.12" || out.Readiness != "ready" {
			t.Errorf("%s: %+v", backend, out)
		}
		set := false
		for _, line := range seen.Received {
			set = set || line == "i 7 10.88.0.12 255.255.255.0 10.88.0.1\r\n"
		}
		if !set || seen.Addresses["7"] != "10.88.0.12" {
			t.Errorf("%s: the console got %q and holds %v", backend, seen.Received, seen.Addresses)
		}
		pods.mu.Lock()
		ip := pods.annotations()["vm.cocoonstack.io/ip"]
		pods.mu.Unlock()
		if ip != "10.88.0.12" {
			t.Errorf("%s: published %v", backend, ip)
		}
	}
}

// A console that never shows its prompt holds the library's console op
// (for its 60 s prompt budget; the pass's total deadline is set far out
// here); cancelling the Run's context, or closing the planner, ends the op
// in flight on either backend, long before: the Run returns, the pass
// ended by the cancel (a shutdown), with nothing marked failed.
func TestACancelEndsTheConsoleOpInFlight(t *testing.T) {
	sim := builtBinary(t, "COCOONFIXUP_SAC_SIM", "sac-sim", "cargo build -p fixup-tests --bins")
	for _, backend := range backends(t) {
		for _, by := range []string{"context", "Close"} {
			root, _, lines := startSim(t, sim, backend, winVMID, "--no-prompt", "7")
			p, err := NewPlanner(ctx, Options{Backend: backend, NoPluginDir: true, CocoonRoot: root, NoCache: true})
			if err != nil {
				t.Fatal(err)
			}
			pods := windowsPod(winVMName, winVMID)
			doc, _ := pods.Get(ctx, "prod", "win-0")
			run, cancel := context.WithCancel(ctx)
			type ended struct {
				out *Outcome
				err error
			}
			done := make(chan ended, 1)
			go func() {
				out, err := p.Run(run, doc, stillVM{winRecord}, pods, RunOptions{Leases: leaseThen(func() {}),
					Settings: Settings{WakeGrace: 100 * time.Millisecond, SACDeadline: time.Hour}})
				done <- ended{out, err}
			}()
			// The console op is in flight once the console has a client.
			if !lines.Scan() || lines.Text() != "connected" {
				t.Fatalf("%s: the console was not dialled: %q", backend, lines.Text())
			}
			if by == "context" {
				cancel()
			} else {
				go p.Close()
			}
			select {
			case e := <-done:
				// The caller's cancel is its own error, beside the summary;
				// Close's is a shutdown without one.
				want := error(nil)
				if by == "context" {
					want = context.Canceled
				}
				if !errors.Is(e.err, want) || (want == nil && e.err != nil) || e.out == nil || e.out.SAC != SACShutdown {
					t.Errorf("%s, %s: the Run ended %+v %v, want the pass ended by the cancel (error %v)", backend, by, e.out, e.err, want)
				}
			// Well inside the console's own budgets (60 s for the prompt, the
			// pass's deadline an hour): only the cancel can end it by then.
			case <-time.After(30 * time.Second):
				t.Fatalf("%s, %s: the console op in flight did not end", backend, by)
			}
			cancel()
			p.Close()
			pods.mu.Lock()
			state := pods.annotations()["vm.cocoonstack.io/post-clone-state"]
			pods.mu.Unlock()
			if state == "failed" {
				t.Errorf("%s, %s: a cancel marked the pod failed", backend, by)
			}
		}
	}
}
