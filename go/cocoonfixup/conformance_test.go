package cocoonfixup

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// The repository's root, from this package's folder.
var root = filepath.Join("..", "..")

// The conformance suite (tests/conformance/*.json) through Run, scenario
// by scenario, on every backend this build has: Run's VM, Pods, Leases,
// Clock and console are fakes that ask `conformance-world` (the Rust
// replays' world, over a pipe) what happens, on a virtual clock; the world
// then checks the writes, events and execs it saw against the scenario,
// exactly as it checks the daemon's and the C library's.

func worldBinary(t *testing.T) string {
	return builtBinary(t, "COCOONFIXUP_WORLD", "conformance-world", "cargo build -p fixup-tests --bins")
}

// world is one scenario's world program and Run's virtual time.
type world struct {
	t      *testing.T
	cmd    *exec.Cmd
	in     *json.Encoder
	out    *bufio.Scanner
	now    int64 // ms since Run started
	base   time.Time
	cancel context.CancelFunc
	// owning: the caller owns the lifecycle, so no write of Run's may
	// carry its keys.
	owning bool
}

type startInfo struct {
	Pod             json.RawMessage `json:"pod"`
	Trigger         string          `json:"trigger"`
	Settings        map[string]any  `json:"settings"`
	AcceptLegacy    bool            `json:"accept_legacy"`
	AcceptAnnotated bool            `json:"accept_annotated"`
	Memory          *struct {
		Record          json.RawMessage `json:"record"`
		NowUnixMS       int64           `json:"now_unix_ms"`
		WatchedSinceNew bool            `json:"watched_since_new"`
	} `json:"memory"`
	Knows *struct {
		Boot        Boot     `json:"boot"`
		SourceImage string   `json:"source_image"`
		RecordLacks []string `json:"record_lacks"`
	} `json:"knows"`
	WallMS int64 `json:"wall_ms"`
	Down   bool  `json:"down"`
}

// typedWorld is the world's VM for a caller whose cocoon client parses
// the record into its own types: the record as a VMRecord.
type typedWorld struct{ *world }

func (w typedWorld) InspectRecord(ctx context.Context, vm string, timeout time.Duration) (*VMRecord, error) {
	doc, err := w.Inspect(ctx, vm, timeout)
	if err != nil {
		return nil, err
	}
	var record VMRecord
	if err := json.Unmarshal(doc, &record); err != nil {
		return nil, err
	}
	return &record, nil
}

// publisher is the caller that owns the lifecycle: each change goes to
// the world as the caller's own write.
type publisher struct{ w *world }

func (p *publisher) Publish(ctx context.Context, pod PodRef, i LifecycleIntent) error {
	orNull := func(s string) any {
		if s == "" {
			return nil
		}
		return s
	}
	p.w.act(map[string]any{"action": "publish", "state": orNull(string(i.State)), "message": orNull(i.Message),
		"observed_generation": orNull(i.ObservedGeneration), "ip": orNull(i.IP), "ready": i.Ready})
	return nil
}

func startWorld(t *testing.T, scenario, cocoonRoot string) *world {
	cmd := exec.Command(worldBinary(t), scenario, cocoonRoot)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	out := bufio.NewScanner(stdout)
	out.Buffer(make([]byte, 1<<16), 64<<20)
	return &world{t: t, cmd: cmd, in: json.NewEncoder(stdin), out: out}
}

func (w *world) ask(request map[string]any, into any) {
	w.t.Helper()
	if err := w.in.Encode(request); err != nil {
		w.t.Fatalf("asking the world: %v", err)
	}
	if !w.out.Scan() {
		w.t.Fatalf("the world did not answer %v: %v", request["op"], w.out.Err())
	}
	if err := json.Unmarshal(w.out.Bytes(), into); err != nil {
		w.t.Fatalf("the world's answer %s: %v", w.out.Bytes(), err)
	}
}

// act carries an action out in the world at the virtual now, moves the
// clock, and shuts the step down (cancels its context) once the world
// is down.
func (w *world) act(action map[string]any) map[string]json.RawMessage {
	w.t.Helper()
	var answer struct {
		Report map[string]json.RawMessage `json:"report"`
		NowMS  int64                      `json:"now_ms"`
		Down   bool                       `json:"down"`
		Error  string                     `json:"error"`
	}
	w.ask(map[string]any{"op": "act", "now_ms": w.now, "action": action}, &answer)
	if answer.Error != "" {
		w.t.Fatalf("the world: %s", answer.Error)
	}
	w.now = answer.NowMS
	if answer.Down {
		w.cancel()
	}
	return answer.Report
}

func ms(d time.Duration) int64 { return d.Milliseconds() }

// live checks that an action a cancel must not interrupt (a read, a
// write, an event, a record) is given a context that is not done, so
// that what the step decided is not lost half-way.
func (w *world) live(ctx context.Context, what string) {
	if ctx.Err() != nil {
		w.t.Errorf("%s was given a cancelled context: a shutdown would lose it", what)
	}
}

// The fakes.

func (w *world) Now() time.Time { return w.base.Add(time.Duration(w.now) * time.Millisecond) }

func (w *world) SleepUntil(ctx context.Context, t time.Time) error {
	report := w.act(map[string]any{"action": "sleep", "until_ms": ms(t.Sub(w.base))})
	if _, ok := report["cancelled"]; ok {
		return context.Canceled
	}
	return nil
}

func (w *world) Inspect(ctx context.Context, vm string, timeout time.Duration) ([]byte, error) {
	w.live(ctx, "inspect")
	report := w.act(map[string]any{"action": "inspect", "vm": vm, "timeout_ms": ms(timeout)})
	if doc, ok := report["inspected"]; ok {
		return doc, nil
	}
	var why string
	json.Unmarshal(report["inspect_error"], &why)
	return nil, errors.New(why)
}

func (w *world) Exec(ctx context.Context, vm string, argv []string, timeout time.Duration) (ExecResult, error) {
	report := w.act(map[string]any{"action": "exec", "vm": vm, "argv": argv, "timeout_ms": ms(timeout)})
	if _, ok := report["cancelled"]; ok {
		return ExecResult{}, context.Canceled
	}
	if raw, ok := report["exec_error"]; ok {
		var why string
		json.Unmarshal(raw, &why)
		return ExecResult{}, errors.New(why)
	}
	var ran struct {
		Exit      *int   `json:"exit"`
		Signal    *int   `json:"signal"`
		Stdout    string `json:"stdout"`
		Stderr    string `json:"stderr"`
		StderrCut bool   `json:"stderr_cut"`
	}
	if err := json.Unmarshal(report["ran"], &ran); err != nil {
		w.t.Fatalf("ran: %v", err)
	}
	res := ExecResult{Stdout: []byte(ran.Stdout), Stderr: []byte(ran.Stderr), StderrCut: ran.StderrCut}
	if ran.Signal != nil {
		res.Signal = *ran.Signal
	} else if ran.Exit != nil {
		res.ExitCode = *ran.Exit
	}
	return res, nil
}

// podError is an API error of the kind the world says.
func podError(raw json.RawMessage) error {
	var e struct {
		Kind    string `json:"kind"`
		Message string `json:"message"`
	}
	json.Unmarshal(raw, &e)
	switch e.Kind {
	case "gone":
		return fmt.Errorf("%w: %s", ErrGone, e.Message)
	case "refused":
		return fmt.Errorf("%w: %s", ErrRefused, e.Message)
	}
	return errors.New(e.Message)
}

func nullable(raw json.RawMessage) []byte {
	if string(raw) == "null" {
		return nil
	}
	return raw
}

func (w *world) Get(ctx context.Context, namespace, name string) ([]byte, error) {
	w.live(ctx, "a read")
	report := w.act(map[string]any{"action": "read"})
	if raw, ok := report["read_error"]; ok {
		return nil, podError(raw)
	}
	return nullable(report["read"]), nil
}

func (w *world) PatchAnnotations(ctx context.Context, namespace, name string, p PodPatch) ([]byte, error) {
	if w.owning {
		for _, key := range []string{KeyLifecycleState, KeyLifecycleMessage, KeyLifecycleObservedGeneration, KeyIP} {
			if _, ok := p.Annotations[key]; ok {
				w.t.Errorf("Run wrote %s though the caller owns the lifecycle", key)
			}
		}
	}
	w.live(ctx, "a patch")
	var version any
	if p.ResourceVersion != "" {
		version = p.ResourceVersion
	}
	report := w.act(map[string]any{"action": "patch", "annotations": p.Annotations, "uid": p.UID, "resource_version": version})
	switch {
	case report["patch_error"] != nil:
		return nil, podError(report["patch_error"])
	case report["changed"] != nil:
		return report["changed"], ErrConflict
	}
	return nullable(report["patched"]), nil
}

func (w *world) Event(ctx context.Context, namespace, name, uid string, e Event) error {
	w.live(ctx, "an event")
	w.act(map[string]any{"action": "tell", "type": e.Type, "reason": e.Reason, "message": e.Message})
	return nil
}

func (w *world) NodePods(ctx context.Context) ([][]byte, error) {
	w.live(ctx, "the node's pods")
	return w.list(map[string]any{"action": "other_pods", "vm_name": ""}, "other_pods")
}

func (w *world) ListEvents(ctx context.Context, namespace, fieldSelector string) ([][]byte, error) {
	w.live(ctx, "the pod's events")
	return w.list(map[string]any{"action": "wake_events", "namespace": namespace, "field_selectors": []string{fieldSelector}}, "events")
}

// list carries out an action whose report is a list under key, or why
// not under key_error.
func (w *world) list(action map[string]any, key string) ([][]byte, error) {
	report := w.act(action)
	if raw, ok := report[key+"_error"]; ok {
		var why string
		json.Unmarshal(raw, &why)
		return nil, errors.New(why)
	}
	var items []json.RawMessage
	raw, truncated := report[key+"_truncated"]
	if !truncated {
		raw = report[key]
	}
	json.Unmarshal(raw, &items)
	out := make([][]byte, len(items))
	for i, item := range items {
		out[i] = item
	}
	if truncated {
		return out, ErrEventsTruncated
	}
	return out, nil
}

func (w *world) Lease(ctx context.Context, mac string) (string, error) {
	w.t.Fatal("Run polls Leases only when it cannot wait on them")
	return "", nil
}

func (w *world) WaitLease(ctx context.Context, mac string, until time.Time) (string, error) {
	report := w.act(map[string]any{"action": "wait_lease", "mac": mac, "until_ms": ms(until.Sub(w.base))})
	if _, ok := report["cancelled"]; ok {
		return "", context.Canceled
	}
	if raw, ok := report["lease_error"]; ok {
		var why string
		json.Unmarshal(raw, &why)
		return "", errors.New(why)
	}
	var ip *string
	json.Unmarshal(report["lease"], &ip)
	if ip == nil {
		return "", nil
	}
	return *ip, nil
}

// records hands Run the scenario's record and keeps what Run stores in
// the world.
type records struct {
	w     *world
	start json.RawMessage
}

func (r *records) Load(ctx context.Context, uid string) (json.RawMessage, error) {
	if string(r.start) == "null" {
		return nil, nil
	}
	return r.start, nil
}

func (r *records) Store(ctx context.Context, uid string, record json.RawMessage) error {
	r.w.live(ctx, "a record")
	r.w.act(map[string]any{"action": "remember", "record": record})
	return nil
}

// The serial console, in the world.
type worldConsole struct{ w *world }

func (c worldConsole) open(ctx context.Context, action json.RawMessage) map[string]any {
	return c.report(action)
}

func (c worldConsole) set(ctx context.Context, action json.RawMessage) map[string]any {
	return c.report(action)
}

func (c worldConsole) report(action json.RawMessage) map[string]any {
	var a map[string]any
	json.Unmarshal(action, &a)
	out := map[string]any{}
	for k, v := range c.w.act(a) {
		out[k] = v
	}
	return out
}

func (c worldConsole) close() {}

// backends are the backends this build can reach the library by.
func backends(t *testing.T) []Backend {
	out := []Backend{BackendProcess}
	if haveLibrary {
		out = append([]Backend{BackendLinked}, out...)
	}
	return out
}

// TestConformanceThroughRun replays every scenario of the suite, and the
// embedder's own (tests/conformance-embedder), through Run on each
// backend, with Run writing the lifecycle and with the caller owning it.
func TestConformanceThroughRun(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(root, "tests", "conformance", "*.json"))
	if err != nil || len(files) < 20 {
		t.Fatalf("the conformance scenarios are missing (%v): %d found", err, len(files))
	}
	embedder, err := filepath.Glob(filepath.Join(root, "tests", "conformance-embedder", "*.json"))
	if err != nil || len(embedder) == 0 {
		t.Fatalf("the embedder's scenarios are missing (%v)", err)
	}
	files = append(files, embedder...)
	sort.Strings(files)
	// What only an embedder that owns the lifecycle sees.
	owned, err := filepath.Glob(filepath.Join(root, "tests", "conformance-owned", "*.json"))
	if err != nil || len(owned) == 0 {
		t.Fatalf("the scenarios of an embedder that owns the lifecycle are missing (%v)", err)
	}
	for _, backend := range backends(t) {
		conformanceThroughRun(t, backend, backend.String(), false, files)
		conformanceThroughRun(t, backend, backend.String()+"-lifecycle-owned", true, append(append([]string(nil), files...), owned...))
	}
}

func conformanceThroughRun(t *testing.T, backend Backend, name string, owning bool, files []string) {
	{
		t.Run(name, func(t *testing.T) {
			cocoonRoot := t.TempDir()
			planners := map[[2]bool]*Planner{}
			defer func() {
				for _, p := range planners {
					p.Close()
				}
			}()
			var failed []string
			for _, file := range files {
				name := strings.TrimSuffix(filepath.Base(file), ".json")
				why := replayOne(t, backend, planners, file, cocoonRoot, owning)
				os.RemoveAll(filepath.Join(cocoonRoot, "run"))
				if why != "" {
					failed = append(failed, name+": "+why)
				}
			}
			if len(failed) > 0 {
				t.Fatalf("%d of %d scenarios differ through Run (%s):\n\n%s", len(failed), len(files), backend, strings.Join(failed, "\n\n"))
			}
			t.Logf("%d scenarios replayed through Run (%s)", len(files), backend)
		})
	}
}

// replayOne replays one scenario; "" when the world found what it
// expected, else why not.
func replayOne(t *testing.T, backend Backend, planners map[[2]bool]*Planner, file, cocoonRoot string, owning bool) string {
	w := startWorld(t, file, cocoonRoot)
	defer w.cmd.Wait()
	var start startInfo
	w.ask(map[string]any{"op": "start"}, &start)
	policy := [2]bool{start.AcceptLegacy, start.AcceptAnnotated}
	p := planners[policy]
	if p == nil {
		var err error
		p, err = NewPlanner(context.Background(), Options{Backend: backend, CocoonRoot: cocoonRoot, NoPluginDir: true,
			NoCache: true, AcceptLegacyVMNames: start.AcceptLegacy, AcceptAnnotatedVMNames: start.AcceptAnnotated})
		if err != nil {
			t.Fatalf("a planner (%s): %v", backend, err)
		}
		planners[policy] = p
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w.cancel = cancel
	w.base = time.UnixMilli(start.WallMS)
	if start.Down {
		cancel()
	}
	o := RunOptions{Trigger: Trigger(start.Trigger), Clock: w, Leases: w, console: worldConsole{w}, settingsDoc: start.Settings}
	if start.Memory != nil {
		o.Records = &records{w: w, start: start.Memory.Record}
		o.WatchedSinceNew = start.Memory.WatchedSinceNew
		w.base = time.UnixMilli(start.Memory.NowUnixMS)
	}
	var vm VM = w
	if start.Knows != nil {
		o.Boot, o.SourceImage = start.Knows.Boot, start.Knows.SourceImage
		if len(start.Knows.RecordLacks) > 0 {
			vm = typedWorld{w}
		}
	}
	if owning {
		w.owning = true
		o.Lifecycle = &publisher{w: w}
	}
	outcome, err := p.Run(ctx, start.Pod, vm, w, o)
	finish := map[string]any{"action": "finish"}
	var stop *StopError
	switch {
	case err == nil, errors.Is(err, context.Canceled) && outcome != nil:
		// A cancel by the caller is a shutdown with its summary.
		finish["summary"] = outcome.Summary
	case errors.As(err, &stop):
		var again any
		if a := stop.Again; a != nil {
			again = map[string]any{"after_ms": a.After.Milliseconds(), "trigger": string(a.Trigger), "tries": a.Tries}
		}
		finish["stop"] = map[string]any{"kind": stop.Kind, "retryable": stop.Retryable, "again": again}
	default:
		return fmt.Sprintf("Run failed: %v", err)
	}
	var verdict struct {
		Passed bool   `json:"passed"`
		Why    string `json:"why"`
	}
	w.ask(map[string]any{"op": "finish", "action": finish}, &verdict)
	if !verdict.Passed {
		return verdict.Why
	}
	return ""
}
