// Command postclone walks the post-clone flow of a node agent over the
// bundled examples with the cocoonfixup package: the decision, the plan,
// one exec per attempt through an exec function the caller supplies, the
// retry budget (3 s between attempts, 180 s in all by default), the error
// chain, and the annotations and events the loop writes.
//
// A daemon such as vk-cocoon keeps its own cocoon client, Kubernetes
// client and goroutines: here the exec is a stand-in guest, the pods live
// in memory, and every write is printed as a JSON line.
//
//	CGO_LDFLAGS="-L$PWD/target/release" go run ./example/postclone -examples ../../examples
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"cocoonfixup"
)

// Exec runs argv in the VM with `cocoon vm exec <vmID> -- argv...`: the
// embedder's own cocoon client. An error means the exec could not be run
// or finished (the client's error, not the guest's exit status).
type Exec func(ctx context.Context, vmID string, argv []string, timeout time.Duration) (cocoonfixup.ExecResult, error)

// Budget is the retry budget of the loop (spec section 5).
type Budget struct {
	Interval    time.Duration // between attempts
	Total       time.Duration // from the first attempt
	ExecTimeout time.Duration // one exec, never past the budget
}

// Pods is the embedder's Kubernetes client, as far as the loop needs it:
// read a pod, patch its annotations under a uid precondition (a pod
// recreated under the same name is not written to), record an event.
type Pods interface {
	Get(name string) ([]byte, error)
	Patch(name, uid string, patch cocoonfixup.Patch) error
	Event(name string, event cocoonfixup.Event)
}

// Outcome is what the flow did with one pod.
type Outcome struct {
	Pod      string   `json:"pod"`
	Action   string   `json:"action"`
	Fixup    string   `json:"fixup,omitempty"` // done, exhausted, plan-failed, vm-mismatch, gone
	Attempts int      `json:"attempts,omitempty"`
	Errors   []string `json:"errors,omitempty"`
}

type podMeta struct {
	Metadata struct {
		Name        string            `json:"name"`
		Namespace   string            `json:"namespace"`
		UID         string            `json:"uid"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
}

// flow is one pod's post-clone work.
type flow struct {
	p      *cocoonfixup.Planner
	pods   Pods
	exec   Exec
	budget Budget
	name   string // namespace/name
	uid    string
	vmID   string
	out    Outcome
}

// current reads the pod again: its JSON and annotations while it is still
// the pod the flow works for, or ok=false when nothing more may be
// written (recreated, hibernating, deleting, handed over, another VM).
func (f *flow) current() (pod []byte, annotations map[string]string, ok bool, err error) {
	pod, err = f.pods.Get(f.name)
	if err != nil {
		return nil, nil, false, err
	}
	ours, err := cocoonfixup.StillOurs(pod, f.uid, f.vmID)
	if err != nil || !ours {
		return nil, nil, false, err
	}
	var meta podMeta
	if err := json.Unmarshal(pod, &meta); err != nil {
		return nil, nil, false, err
	}
	return pod, meta.Metadata.Annotations, true, nil
}

// write patches the pod (under its uid) and records the event, as the
// daemon does: the event is told even when the patch cannot be written.
func (f *flow) write(patch cocoonfixup.Patch, event *cocoonfixup.Event) error {
	var err error
	if patch != nil {
		err = f.pods.Patch(f.name, f.uid, patch)
	}
	if event != nil {
		f.pods.Event(f.name, *event)
	}
	return err
}

// PostClone is the flow for one pod whose VM record (as `cocoon vm inspect
// --json` printed it) is vm, in the daemon's order: the cheap gate, the
// binding, the decision, the plan, the loop. The IP wait that follows is
// the embedder's own. A daemon that picks up work after a restart also
// records cocoonfixup.Resumed(decision.Op) for RunLoop and IPWaitOnly.
func PostClone(ctx context.Context, p *cocoonfixup.Planner, pods Pods, name string, vm []byte, exec Exec, b Budget) (Outcome, error) {
	f := &flow{p: p, pods: pods, exec: exec, budget: b, name: name, out: Outcome{Pod: name}}
	pod, err := pods.Get(name)
	if err != nil {
		return f.out, err
	}
	var meta podMeta
	if err := json.Unmarshal(pod, &meta); err != nil {
		return f.out, err
	}
	f.uid = meta.Metadata.UID
	// The VM the work is for: the record's id, else the pod's annotation
	// (the report says the same once there is one).
	var record struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(vm, &record); err != nil {
		return f.out, err
	}
	f.vmID = record.ID
	if f.vmID == "" {
		f.vmID = meta.Metadata.Annotations["vm.cocoonstack.io/id"]
	}
	// The part of spec section 8 that needs only the pod: no cocoon call
	// for a pod the host must leave alone.
	gate, err := cocoonfixup.Gate(pod)
	if err != nil {
		return f.out, err
	}
	if gate.Action != cocoonfixup.NeedsFacts {
		f.out.Action = strings.TrimSpace(string(gate.Action) + " " + gate.Why)
		return f.out, nil
	}
	// The fixup is over: only the IP wait is left, and nothing is planned.
	if gate.Marker == "done" {
		if ev, err := p.VMMismatch(pod, vm); err != nil || ev != nil {
			return f.mismatch(ev, err)
		}
		f.out.Action = string(cocoonfixup.IPWaitOnly)
		return f.out, nil
	}
	report, err := p.Plan(pod, vm, cocoonfixup.Overrides{})
	var cfErr *cocoonfixup.Error
	if errors.As(err, &cfErr) {
		switch {
		case cfErr.Code == cocoonfixup.CodeVMMismatch:
			ev, err := p.VMMismatch(pod, vm)
			if err == nil && ev == nil {
				err = fmt.Errorf("the planner refused the VM but its binding holds: %w", cfErr)
			}
			return f.mismatch(ev, err)
		case cfErr.PlanFailed():
			return f.planFailed(err)
		}
	}
	if err != nil {
		return f.out, err // the node is at fault, or a bug: retried later, the pod is left as it is
	}
	// The VM the plan was made for: the record's id, else the pod's.
	f.vmID = report.VM.ID
	decision, err := cocoonfixup.Decide(pod, report.NeedsFixup)
	if err != nil {
		return f.out, err
	}
	f.out.Action = string(decision.Action)
	if decision.Action != cocoonfixup.RunLoop {
		return f.out, nil // the IP wait (or nothing) follows
	}
	return f.runLoop(ctx, report)
}

func (f *flow) mismatch(ev *cocoonfixup.Event, err error) (Outcome, error) {
	if err != nil {
		return f.out, err
	}
	f.pods.Event(f.name, *ev) // an event only: nothing is written to the pod
	f.out.Action, f.out.Fixup = "nothing", "vm-mismatch"
	return f.out, nil
}

func (f *flow) planFailed(planErr error) (Outcome, error) {
	f.out.Action, f.out.Fixup = "run-loop", "plan-failed"
	_, annotations, ok, err := f.current()
	if err != nil || !ok {
		f.out.Fixup = "gone"
		return f.out, err
	}
	rec, err := cocoonfixup.PlanFailed(annotations, planErr)
	if err != nil {
		return f.out, err
	}
	f.out.Errors = []string{rec.Line}
	return f.out, f.write(rec.Patch, rec.Event)
}

func (f *flow) runLoop(ctx context.Context, report *cocoonfixup.Report) (Outcome, error) {
	f.out.Fixup = "gone"
	running, err := cocoonfixup.StatePatch("running")
	if err != nil {
		return f.out, err
	}
	// Not on a pod handed over while cocoon was asked about its VM.
	if _, _, ok, err := f.current(); err != nil || !ok {
		return f.out, err
	}
	if err := f.write(running, nil); err != nil {
		return f.out, err
	}
	deadline := time.Now().Add(f.budget.Total)
	for {
		// Before each attempt: a pod hibernated, deleted or recreated
		// meanwhile gets no more execs. A failed read counts as still ours:
		// a flaky API server must not stop a fixup (the uid precondition
		// still guards the writes).
		if _, _, ok, err := f.current(); err == nil && !ok {
			return f.out, nil
		}
		f.out.Attempts++
		attempt, err := f.p.NewAttempt(report)
		if err != nil {
			return f.out, err
		}
		timeout := f.budget.ExecTimeout
		if left := time.Until(deadline); left < timeout {
			timeout = left
		}
		if timeout < time.Millisecond {
			timeout = time.Millisecond
		}
		res, execErr := f.exec(ctx, attempt.VMID, attempt.Argv, timeout)
		var line string
		if execErr != nil {
			if line, err = cocoonfixup.OneLine(execErr.Error()); err != nil {
				return f.out, err
			}
		} else {
			verdict, err := attempt.Judge(res)
			if err != nil {
				return f.out, err
			}
			if verdict.OK {
				rec, err := cocoonfixup.Succeeded(report.Scenario, f.out.Attempts)
				if err != nil {
					return f.out, err
				}
				// Written without reading the pod again, as the daemon
				// does: the patch's uid precondition guards it.
				if err := f.write(rec.Patch, rec.Event); err != nil {
					return f.out, err
				}
				f.out.Fixup = "done"
				return f.out, nil
			}
			line = verdict.Error
		}
		rec, err := cocoonfixup.AttemptFailed(f.out.Attempts, line)
		if err != nil {
			return f.out, err
		}
		f.pods.Event(f.name, *rec.Event)
		f.out.Errors = append(f.out.Errors, rec.Line)
		if !time.Now().Add(f.budget.Interval).Before(deadline) {
			break
		}
		select {
		case <-time.After(f.budget.Interval):
		case <-ctx.Done():
			return f.out, ctx.Err()
		}
	}
	// The failure record goes over the annotations as they are now.
	_, annotations, ok, err := f.current()
	if err != nil || !ok {
		return f.out, err
	}
	rec, err := cocoonfixup.Exhausted(annotations, report, f.out.Attempts, f.budget.Total, f.out.Errors)
	if err != nil {
		return f.out, err
	}
	f.out.Fixup, f.out.Errors = "exhausted", rec.Errors
	return f.out, f.write(rec.Patch, rec.Event)
}

// Guest is a stand-in for a VM behind `cocoon vm exec`: it answers an
// attempt's argv as the rendered script would, failing the first
// FailFirst attempts at their second step.
type Guest struct {
	FailFirst int
	execs     int
}

var (
	stepsRe = regexp.MustCompile(`step [0-9]+/([0-9]+) start`)
	nonceRe = regexp.MustCompile(`^'?([0-9a-f]{32})'?$`)
)

// Exec answers one attempt.
func (g *Guest) Exec(_ context.Context, _ string, argv []string, _ time.Duration) (cocoonfixup.ExecResult, error) {
	g.execs++
	fail := g.execs <= g.FailFirst
	m := nonceRe.FindStringSubmatch(argv[len(argv)-1])
	if m == nil {
		// A plan run directly (one run step) has no markers: its exit
		// code says.
		if fail {
			return cocoonfixup.ExecResult{ExitCode: 1, Stderr: []byte("stand-in: the command failed")}, nil
		}
		return cocoonfixup.ExecResult{}, nil
	}
	nonce := m[1]
	total := 1
	if s := stepsRe.FindStringSubmatch(strings.Join(argv, " ")); s != nil {
		total, _ = strconv.Atoi(s[1])
	}
	var stderr strings.Builder
	for i := 1; i <= total; i++ {
		fmt.Fprintf(&stderr, "\ncocoon-fixup: %s step %d/%d start\n", nonce, i, total)
		if fail && i == 2 {
			stderr.WriteString("stand-in: No space left on device\n")
			fmt.Fprintf(&stderr, "\ncocoon-fixup: %s step %d/%d failed exit 5\n", nonce, i, total)
			return cocoonfixup.ExecResult{ExitCode: 5, Stderr: []byte(stderr.String())}, nil
		}
	}
	fmt.Fprintf(&stderr, "\ncocoon-fixup: %s done\n", nonce)
	return cocoonfixup.ExecResult{Stderr: []byte(stderr.String())}, nil
}

// memoryPods is a stand-in API server: pods in memory, patches applied
// under the uid precondition, everything written printed as JSON lines.
type memoryPods struct {
	pods map[string]map[string]any
	w    io.Writer
}

func (m *memoryPods) add(pod []byte) (string, error) {
	var obj map[string]any
	if err := json.Unmarshal(pod, &obj); err != nil {
		return "", err
	}
	var meta podMeta
	if err := json.Unmarshal(pod, &meta); err != nil {
		return "", err
	}
	name := meta.Metadata.Namespace + "/" + meta.Metadata.Name
	m.pods[name] = obj
	return name, nil
}

func (m *memoryPods) Get(name string) ([]byte, error) {
	obj, ok := m.pods[name]
	if !ok {
		return nil, fmt.Errorf("pod %s not found", name)
	}
	return json.Marshal(obj)
}

func (m *memoryPods) Patch(name, uid string, patch cocoonfixup.Patch) error {
	meta, _ := m.pods[name]["metadata"].(map[string]any)
	if meta == nil || meta["uid"] != uid {
		return fmt.Errorf("pod %s: uid precondition failed", name)
	}
	annotations, _ := meta["annotations"].(map[string]any)
	if annotations == nil {
		annotations = map[string]any{}
		meta["annotations"] = annotations
	}
	for k, v := range patch {
		if v == nil {
			delete(annotations, k)
		} else {
			annotations[k] = *v
		}
	}
	line, _ := json.Marshal(map[string]any{"pod": name, "patch": patch})
	fmt.Fprintln(m.w, string(line))
	return nil
}

func (m *memoryPods) Event(name string, e cocoonfixup.Event) {
	line, _ := json.Marshal(map[string]any{"pod": name, "event": e})
	fmt.Fprintln(m.w, string(line))
}

// Run plans and repairs every example under dir with the planner options
// o, writing to w.
func Run(dir string, o cocoonfixup.Options, failFirst int, b Budget, w io.Writer) ([]Outcome, error) {
	p, err := cocoonfixup.NewPlanner(o)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	podFiles, err := filepath.Glob(filepath.Join(dir, "*", "pod.json"))
	if err != nil || len(podFiles) == 0 {
		return nil, fmt.Errorf("no examples (*/pod.json) under %s", dir)
	}
	pods := &memoryPods{pods: map[string]map[string]any{}, w: w}
	var outcomes []Outcome
	for _, podPath := range podFiles {
		pod, err := os.ReadFile(podPath)
		if err != nil {
			return nil, err
		}
		vm, err := os.ReadFile(filepath.Join(filepath.Dir(podPath), "vm.json"))
		if err != nil {
			return nil, err
		}
		name, err := pods.add(pod)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", podPath, err)
		}
		guest := &Guest{FailFirst: failFirst}
		out, err := PostClone(context.Background(), p, pods, name, vm, guest.Exec, b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", podPath, err)
		}
		line, _ := json.Marshal(out)
		fmt.Fprintln(w, string(line))
		outcomes = append(outcomes, out)
	}
	return outcomes, nil
}

func main() {
	dir := flag.String("examples", "examples", "the folder of bundled examples (each */pod.json and vm.json, and cocoon-root/)")
	failFirst := flag.Int("fail-first", 1, "the stand-in guest fails this many attempts per pod before one succeeds")
	interval := flag.Duration("interval", 3*time.Second, "wait between attempts")
	total := flag.Duration("budget", 180*time.Second, "retry budget from the first attempt")
	timeout := flag.Duration("exec-timeout", 90*time.Second, "timeout of one exec")
	noCache := flag.Bool("no-cache", false, "compile the plugins instead of using the per-user cache")
	flag.Parse()
	options := cocoonfixup.Options{CocoonRoot: filepath.Join(*dir, "cocoon-root"), NoCache: *noCache}
	if _, err := Run(*dir, options, *failFirst, Budget{Interval: *interval, Total: *total, ExecTimeout: *timeout}, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "postclone:", err)
		os.Exit(1)
	}
}
