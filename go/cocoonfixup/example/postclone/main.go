// Command postclone walks the post-clone flow of a node agent over the
// bundled examples with the cocoonfixup package: the decision, the plan,
// one exec per attempt through an exec function the caller supplies, the
// retry budget (3 s between attempts, 180 s in all by default), the error
// chain, and the annotations and events the loop writes.
//
// A daemon such as vk-cocoon keeps its own cocoon client, Kubernetes
// client and goroutines: here the exec is a stand-in guest and the writes
// are printed as JSON lines.
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

// Sink receives what the loop writes: annotation patches and events. A
// daemon sends them to the API server; the example prints them.
type Sink interface {
	Patch(pod string, patch cocoonfixup.Patch)
	Event(pod string, event cocoonfixup.Event)
}

// Outcome is what the flow did with one pod.
type Outcome struct {
	Pod      string   `json:"pod"`
	Action   string   `json:"action"`
	Fixup    string   `json:"fixup,omitempty"` // done, exhausted, plan-failed, vm-mismatch
	Attempts int      `json:"attempts,omitempty"`
	Errors   []string `json:"errors,omitempty"`
}

// PostClone is the flow for one pod whose VM record is vm: what the
// daemon's `run` does, minus the IP wait.
func PostClone(ctx context.Context, p *cocoonfixup.Planner, pod, vm []byte, exec Exec, b Budget, sink Sink) (Outcome, error) {
	var meta struct {
		Metadata struct {
			Name        string            `json:"name"`
			Namespace   string            `json:"namespace"`
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(pod, &meta); err != nil {
		return Outcome{}, err
	}
	name := meta.Metadata.Namespace + "/" + meta.Metadata.Name
	out := Outcome{Pod: name}
	// The cheap part of spec section 8 first: no cocoon call for a pod
	// the host must leave alone.
	gate, err := cocoonfixup.Gate(pod)
	if err != nil {
		return out, err
	}
	if gate.Action != cocoonfixup.NeedsFacts {
		out.Action = string(gate.Action) + " " + gate.Why
		return out, nil
	}
	report, err := p.Plan(pod, vm, cocoonfixup.Overrides{})
	var cfErr *cocoonfixup.Error
	if errors.As(err, &cfErr) && cfErr.PlanFailed() {
		// No plan can be made: fail the pod without a hint.
		rec, err2 := cocoonfixup.PlanFailed(meta.Metadata.Annotations, err)
		if err2 != nil {
			return out, err2
		}
		sink.Patch(name, rec.Patch)
		sink.Event(name, *rec.Event)
		out.Action, out.Fixup, out.Errors = "run-loop", "plan-failed", []string{rec.Line}
		return out, nil
	}
	if err != nil {
		return out, err // a node error or a bug: retried later, the pod is not failed
	}
	if !report.Bound() {
		ev, err := cocoonfixup.VMMismatch(pod, report.VM.Name, false)
		if err != nil {
			return out, err
		}
		sink.Event(name, *ev)
		out.Action, out.Fixup = "nothing", "vm-mismatch"
		return out, nil
	}
	decision, err := cocoonfixup.Decide(pod, report.NeedsFixup)
	if err != nil {
		return out, err
	}
	out.Action = string(decision.Action)
	if decision.Action != cocoonfixup.RunLoop {
		return out, nil // the IP wait (or nothing) follows
	}
	return runLoop(ctx, p, report, meta.Metadata.Annotations, exec, b, sink, out)
}

func runLoop(ctx context.Context, p *cocoonfixup.Planner, report *cocoonfixup.Report, annotations map[string]string,
	exec Exec, b Budget, sink Sink, out Outcome) (Outcome, error) {
	running, err := cocoonfixup.StatePatch("running")
	if err != nil {
		return out, err
	}
	sink.Patch(out.Pod, running)
	deadline := time.Now().Add(b.Total)
	for {
		out.Attempts++
		attempt, err := p.NewAttempt(report)
		if err != nil {
			return out, err
		}
		timeout := b.ExecTimeout
		if left := time.Until(deadline); left < timeout {
			timeout = left
		}
		if timeout < time.Millisecond {
			timeout = time.Millisecond
		}
		res, execErr := exec(ctx, report.VM.ID, attempt.Argv, timeout)
		var line string
		if execErr != nil {
			line, err = cocoonfixup.OneLine(execErr.Error())
			if err != nil {
				return out, err
			}
		} else {
			verdict, err := attempt.Judge(res)
			if err != nil {
				return out, err
			}
			if verdict.OK {
				rec, err := cocoonfixup.Succeeded(report.Scenario, out.Attempts)
				if err != nil {
					return out, err
				}
				sink.Patch(out.Pod, rec.Patch)
				sink.Event(out.Pod, *rec.Event)
				out.Fixup = "done"
				return out, nil
			}
			line = verdict.Error
		}
		rec, err := cocoonfixup.AttemptFailed(out.Attempts, line)
		if err != nil {
			return out, err
		}
		sink.Event(out.Pod, *rec.Event)
		out.Errors = append(out.Errors, rec.Line)
		if !time.Now().Add(b.Interval).Before(deadline) {
			break
		}
		select {
		case <-time.After(b.Interval):
		case <-ctx.Done():
			return out, ctx.Err()
		}
	}
	// A daemon reads the pod again here and writes over its annotations
	// as they are now; the example has only the ones it started with.
	rec, err := cocoonfixup.Exhausted(annotations, report, out.Attempts, b.Total, out.Errors)
	if err != nil {
		return out, err
	}
	sink.Patch(out.Pod, rec.Patch)
	sink.Event(out.Pod, *rec.Event)
	out.Fixup, out.Errors = "exhausted", rec.Errors
	return out, nil
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
			stderr.WriteString("stand-in: Failed to restart the service: unit is masked\n")
			fmt.Fprintf(&stderr, "\ncocoon-fixup: %s step %d/%d failed exit 5\n", nonce, i, total)
			return cocoonfixup.ExecResult{ExitCode: 5, Stderr: []byte(stderr.String())}, nil
		}
	}
	fmt.Fprintf(&stderr, "\ncocoon-fixup: %s done\n", nonce)
	return cocoonfixup.ExecResult{Stderr: []byte(stderr.String())}, nil
}

// printer prints what the loop writes as JSON lines.
type printer struct{ w io.Writer }

func (p printer) Patch(pod string, patch cocoonfixup.Patch) {
	line, _ := json.Marshal(map[string]any{"pod": pod, "patch": patch})
	fmt.Fprintln(p.w, string(line))
}

func (p printer) Event(pod string, e cocoonfixup.Event) {
	line, _ := json.Marshal(map[string]any{"pod": pod, "event": e})
	fmt.Fprintln(p.w, string(line))
}

// Run plans and repairs every example under dir, writing to w.
func Run(dir string, failFirst int, b Budget, w io.Writer) ([]Outcome, error) {
	p, err := cocoonfixup.NewPlanner(cocoonfixup.Options{CocoonRoot: filepath.Join(dir, "cocoon-root")})
	if err != nil {
		return nil, err
	}
	defer p.Close()
	pods, err := filepath.Glob(filepath.Join(dir, "*", "pod.json"))
	if err != nil || len(pods) == 0 {
		return nil, fmt.Errorf("no examples (*/pod.json) under %s", dir)
	}
	var outcomes []Outcome
	for _, podPath := range pods {
		pod, err := os.ReadFile(podPath)
		if err != nil {
			return nil, err
		}
		vm, err := os.ReadFile(filepath.Join(filepath.Dir(podPath), "vm.json"))
		if err != nil {
			return nil, err
		}
		guest := &Guest{FailFirst: failFirst}
		out, err := PostClone(context.Background(), p, pod, vm, guest.Exec, b, printer{w})
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
	flag.Parse()
	if _, err := Run(*dir, *failFirst, Budget{Interval: *interval, Total: *total, ExecTimeout: *timeout}, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "postclone:", err)
		os.Exit(1)
	}
}
