package cocoonfixup

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The tests' one planner over the bundled examples' cocoon root, with a
// cache of its own.
var shared *Planner

// ctx is the tests' context.
var ctx = context.Background()

func TestMain(m *testing.M) {
	scratch, err := os.MkdirTemp("", "cocoonfixup-")
	if err != nil {
		panic(err)
	}
	shared, err = NewPlanner(context.Background(), Options{
		CocoonRoot: filepath.Join(root, "examples", "cocoon-root"),
		CacheDir:   filepath.Join(scratch, "cache"),
		CacheKey:   filepath.Join(scratch, "key", "cache.key"),
		Strict:     true,
	})
	if err != nil {
		panic(err)
	}
	code := m.Run()
	shared.Close()
	os.RemoveAll(scratch)
	os.Exit(code)
}

// example is one bundled example: its folder, pod, VM and extra `plan`
// flags.
type example struct {
	name    string
	dir     string
	pod, vm []byte
	args    []string
}

func examples(t testing.TB) []example {
	dirs, err := filepath.Glob(filepath.Join(root, "examples", "*", "pod.json"))
	if err != nil || len(dirs) < 5 {
		t.Fatalf("the bundled examples are missing (%v): found %v", err, dirs)
	}
	var out []example
	for _, pod := range dirs {
		dir := filepath.Dir(pod)
		ex := example{name: filepath.Base(dir), dir: dir}
		ex.pod = read(t, pod)
		ex.vm = read(t, filepath.Join(dir, "vm.json"))
		if args, err := os.ReadFile(filepath.Join(dir, "args")); err == nil {
			ex.args = strings.Fields(string(args))
		}
		out = append(out, ex)
	}
	return out
}

func read(t testing.TB, path string) []byte {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// overrides turns an example's `plan` flags into Overrides.
func overrides(t testing.TB, args []string) Overrides {
	var o Overrides
	for i := 0; i < len(args); i++ {
		switch args[i] {
		case "--boot":
			i++
			o.Boot = args[i]
		case "--source-image":
			i++
			o.SourceImage = args[i]
		default:
			t.Fatalf("an example's args has %q, which this test does not map", args[i])
		}
	}
	return o
}

func cli(t testing.TB) string {
	return builtBinary(t, "COCOON_FIXUP_BIN", "cocoon-fixup", "cargo build -p fixup-host")
}

// builtBinary is a binary of this checkout: env names it, else it is
// target/debug/<name>; how says how to build it.
func builtBinary(t testing.TB, env, name, how string) string {
	bin := os.Getenv(env)
	if bin == "" {
		bin = filepath.Join(root, "target", "debug", name)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s is needed (%v): `%s`, or set %s", name, err, how, env)
	}
	return bin
}

func decode(t testing.TB, doc []byte) map[string]any {
	var v map[string]any
	if err := json.Unmarshal(doc, &v); err != nil {
		t.Fatalf("not a JSON object: %v\n%s", err, doc)
	}
	return v
}

// The package's report for every bundled example is the CLI's, value for
// value, typed and untyped.
func TestReportsAreTheCLIs(t *testing.T) {
	bin := cli(t)
	cache := t.TempDir()
	for _, ex := range examples(t) {
		t.Run(ex.name, func(t *testing.T) {
			args := append([]string{"plan", "--pod", filepath.Join(ex.dir, "pod.json"), "--vm", filepath.Join(ex.dir, "vm.json"),
				"--cocoon-root", filepath.Join(root, "examples", "cocoon-root"), "--cache-dir", cache, "--output", "json"}, ex.args...)
			cmd := exec.Command(bin, args...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			want, err := cmd.Output()
			if err != nil {
				t.Fatalf("cocoon-fixup %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
			}
			report, err := shared.Plan(ctx, ex.pod, ex.vm, overrides(t, ex.args))
			if err != nil {
				t.Fatalf("Plan: %v", err)
			}
			got, wantDoc := decode(t, report.JSON()), decode(t, want)
			// The seal is the library's one addition: a plan has one.
			if _, sealed := got["seal"]; sealed != report.NeedsFixup {
				t.Fatalf("seal present: %v, needs_fixup: %v", sealed, report.NeedsFixup)
			}
			delete(got, "seal")
			if !reflect.DeepEqual(got, wantDoc) {
				t.Fatalf("the package's report differs from the CLI's\npackage: %s\ncli:     %s", report.JSON(), want)
			}
			var typed Report
			if err := json.Unmarshal(want, &typed); err != nil {
				t.Fatal(err)
			}
			mine := *report
			mine.raw, mine.plan, mine.Seal, mine.p, mine.c = nil, nil, "", nil, nil
			if !reflect.DeepEqual(mine, typed) {
				t.Fatalf("typed reports differ:\n%+v\n%+v", mine, typed)
			}
			if report.Binding == nil {
				t.Fatal("the report carries no binding verdict")
			}
		})
	}
}

// Many goroutines plan at once on one planner, and every answer is the
// one a single goroutine gets.
func TestConcurrentPlanning(t *testing.T) {
	exs := examples(t)
	want := map[string]map[string]any{}
	ovr := make([]Overrides, len(exs))
	for k, ex := range exs {
		ovr[k] = overrides(t, ex.args)
		r, err := shared.Plan(ctx, ex.pod, ex.vm, ovr[k])
		if err != nil {
			t.Fatal(err)
		}
		want[ex.name] = decode(t, r.JSON())
	}
	var wg sync.WaitGroup
	failures := make(chan string, 64)
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 40; i++ {
				k := (g + i) % len(exs)
				ex := exs[k]
				r, err := shared.Plan(ctx, ex.pod, ex.vm, ovr[k])
				if err != nil {
					failures <- fmt.Sprintf("goroutine %d, %s: %v", g, ex.name, err)
					return
				}
				if !reflect.DeepEqual(decode(t, r.JSON()), want[ex.name]) {
					failures <- fmt.Sprintf("goroutine %d, %s: another answer", g, ex.name)
					return
				}
				if r.NeedsFixup {
					if _, err := shared.NewAttempt(ctx, r); err != nil {
						failures <- fmt.Sprintf("goroutine %d, %s: attempt: %v", g, ex.name, err)
						return
					}
				}
			}
		}(g)
	}
	wg.Wait()
	close(failures)
	for f := range failures {
		t.Error(f)
	}
}

func hostilePlanner(t *testing.T) *Planner { return hostilePlannerWith(t, Limits{}) }

func hostilePlannerWith(t *testing.T, limits Limits) *Planner {
	src := os.Getenv("COCOONFIXUP_HOSTILE_PLUGIN")
	if src == "" {
		t.Fatal("COCOONFIXUP_HOSTILE_PLUGIN must name the hostile test plugin (tests/plugins/hostile, built by `cargo test`): `cargo test -p fixup-capi --test go` sets it")
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "hostile.wasm"), read(t, src), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := NewPlanner(ctx, Options{PluginDir: dir, NoCache: true, Strict: true, CocoonRoot: filepath.Join(root, "examples", "cocoon-root"), Limits: limits})
	if err != nil {
		t.Fatalf("a planner with the hostile plugin: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// A hostile plugin's failure reaches Go as a typed error naming it.
func TestHostilePluginErrorsAreTyped(t *testing.T) {
	p := hostilePlanner(t)
	pod := read(t, filepath.Join(root, "examples", "oci-static", "pod.json"))
	vm := read(t, filepath.Join(root, "examples", "oci-static", "vm.json"))
	pod = bytes.ReplaceAll(pod, []byte(`guest-flavor": "ubuntu"`), []byte(`guest-flavor": "hostile"`))
	cases := []struct {
		behaviour string
		code      Code
		says      string
	}{
		{"spin", CodePluginLimit, "fuel"},
		{"balloon", CodePluginLimit, "memory"},
		{"panic", CodePluginFailed, "panicked"},
		{"snoop-file", CodePluginFailed, "denies"},
		{"wide", CodePluginFailed, "256"},
		{"babble", CodePluginLimit, "1000 messages"},
		{"other", 0, ""},
	}
	for _, c := range cases {
		t.Run(c.behaviour, func(t *testing.T) {
			id := "hostile-" + c.behaviour
			podC := bytes.ReplaceAll(pod, []byte(`"vm-7f3a9c21"`), []byte(strconv.Quote(id)))
			vmC := bytes.ReplaceAll(vm, []byte(`"vm-7f3a9c21"`), []byte(strconv.Quote(id)))
			r, err := p.Plan(ctx, podC, vmC, Overrides{})
			if c.code == 0 {
				if err != nil || !r.NeedsFixup || r.Plugins[0].Name != "hostile" {
					t.Fatalf("a well-behaved call: %v", err)
				}
				return
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("want an *Error, got %v", err)
			}
			if e.Code != c.code || !strings.Contains(e.Message, "hostile") || !strings.Contains(e.Message, c.says) {
				t.Fatalf("want %s naming the plugin and %q, got %s: %s", c.code, c.says, e.Code, e.Message)
			}
			if !e.PlanFailed() {
				t.Fatalf("%s must fail the pod", e.Code)
			}
			rec, err := shared.PlanFailed(ctx, map[string]string{}, err)
			if err != nil {
				t.Fatal(err)
			}
			if *rec.Patch[KeyPostCloneState] != "failed" || !strings.HasPrefix(rec.Line, "no plan could be made: plugin hostile") {
				t.Fatalf("plan-failed record: %+v %q", rec.Patch, rec.Line)
			}
			if rec.Event.Reason != "PostClonePlanFailed" || rec.Event.Type != "Warning" {
				t.Fatalf("event %+v", rec.Event)
			}
		})
	}
	// The planner still serves after the failures.
	plain := read(t, filepath.Join(root, "examples", "oci-static", "pod.json"))
	if r, err := p.Plan(ctx, plain, vm, Overrides{}); err != nil || r.Plugins[0].Name != "oci-networkd" {
		t.Fatalf("after the hostile calls: %v", err)
	}
}

// A plugin call stopped by its wall-clock deadline (the node's time, not
// the plugin's fuel: a loaded host) is the node's failure, retried, never
// the pod's.
func TestADeadlineBreachIsTheNodes(t *testing.T) {
	p := hostilePlannerWith(t, Limits{Fuel: 1 << 40, Deadline: 50 * time.Millisecond})
	pod := read(t, filepath.Join(root, "examples", "oci-static", "pod.json"))
	vm := read(t, filepath.Join(root, "examples", "oci-static", "vm.json"))
	pod = bytes.ReplaceAll(pod, []byte(`guest-flavor": "ubuntu"`), []byte(`guest-flavor": "hostile"`))
	pod = bytes.ReplaceAll(pod, []byte(`"vm-7f3a9c21"`), []byte(`"hostile-spin"`))
	vm = bytes.ReplaceAll(vm, []byte(`"vm-7f3a9c21"`), []byte(`"hostile-spin"`))
	_, err := p.Plan(ctx, pod, vm, Overrides{})
	var e *Error
	if !errors.As(err, &e) || e.Code != CodeNode || !errors.Is(err, ErrRetryable) || e.PlanFailed() {
		t.Fatalf("want a retryable node error, got %v", err)
	}
	if !strings.Contains(e.Message, "hostile") || !strings.Contains(e.Message, "deadline") {
		t.Fatalf("the message names the plugin and the deadline: %s", e.Message)
	}
}

func TestInputErrorsAreTyped(t *testing.T) {
	vm := read(t, filepath.Join(root, "examples", "oci-static", "vm.json"))
	pod := read(t, filepath.Join(root, "examples", "oci-static", "pod.json"))
	check := func(name string, err error, code Code) {
		t.Helper()
		var e *Error
		if !errors.As(err, &e) || e.Code != code {
			t.Errorf("%s: want %s, got %v", name, code, err)
		}
	}
	_, err := shared.Plan(ctx, []byte(`{"kind":"Pod"`), vm, Overrides{})
	check("truncated pod", err, CodeBadInput)
	_, err = shared.Plan(ctx, pod, nil, Overrides{})
	check("empty VM record", err, CodeBadRecord)
	_, err = shared.Plan(ctx, pod, vm, Overrides{Boot: "reboot"})
	check("unknown boot kind", err, CodeInvalidArgument)
	mismatched := bytes.Replace(vm, []byte(`"id": "vm-7f3a9c21"`), []byte(`"id": "vm-00000000"`), 1)
	_, err = shared.Plan(ctx, pod, mismatched, Overrides{})
	check("inspect and annotation disagree", err, CodeVMMismatch)
	badMAC := bytes.Replace(vm, []byte(`"mac": "52:54:00:3a:91:0c"`), []byte(`"mac": "52:54:00:3a:91"`), 1)
	_, err = shared.Plan(ctx, pod, badMAC, Overrides{})
	check("a MAC that does not validate", err, CodeBadFacts)
	_, err = NewPlanner(ctx, Options{PluginDir: "/nonexistent/plugins"})
	check("missing plugin directory", err, CodeLoad)
	_, err = NewPlanner(ctx, Options{Limits: Limits{MemoryMiB: 100000}})
	check("bad limit", err, CodeInvalidArgument)
	_, err = NewPlanner(ctx, Options{AllowedPlugins: []string{"abc"}})
	check("bad digest", err, CodeInvalidArgument)
	_, err = NewPlanner(ctx, Options{PluginPolicy: map[string]GuestPolicy{"x": {Writes: []string{"/etc/../shadow"}}}})
	check("bad narrowing", err, CodeInvalidArgument)
	_, err = NewPlanner(ctx, Options{PluginPolicy: map[string]GuestPolicy{"x": {Links: []string{".eth*"}}}})
	check("bad links narrowing", err, CodeInvalidArgument)
}

// Contract 0.3.0's parts of a plan and a narrowing read and write under
// the host's JSON names.
func TestNameLinkParentsAndLinks(t *testing.T) {
	text := `{"description":"name eth0","phase":"link","best_effort":false,` +
		`"name_link":{"mac":"52:54:00:12:34:56","name":"eth0"}}`
	dec := json.NewDecoder(strings.NewReader(text))
	dec.DisallowUnknownFields()
	var step Step
	if err := dec.Decode(&step); err != nil {
		t.Fatal(err)
	}
	if step.NameLink == nil || *step.NameLink != (NameLink{Mac: "52:54:00:12:34:56", Name: "eth0"}) {
		t.Errorf("name_link: %+v", step.NameLink)
	}
	text = `{"description":"w","phase":"configure","best_effort":false,` +
		`"write_file":{"path":"/etc/network/interfaces","content":"auto lo\n","mode":"0644","parents":true}}`
	dec = json.NewDecoder(strings.NewReader(text))
	dec.DisallowUnknownFields()
	step = Step{}
	if err := dec.Decode(&step); err != nil {
		t.Fatal(err)
	}
	if step.WriteFile == nil || !step.WriteFile.Parents {
		t.Errorf("write_file.parents: %+v", step.WriteFile)
	}
	out, err := json.Marshal(GuestPolicy{Links: []string{"eth*"}})
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != `{"links":["eth*"]}` {
		t.Errorf("links narrowing: %s", out)
	}
}

// A VM that is not the pod's is refused before anything looks at it; its
// event never names the other VM.
func TestBindingVerdict(t *testing.T) {
	pod := read(t, filepath.Join(root, "examples", "oci-static", "pod.json"))
	vm := read(t, filepath.Join(root, "examples", "oci-static", "vm.json"))
	r, err := shared.Plan(ctx, pod, vm, Overrides{})
	if err != nil || !r.Bound() || r.Binding.Form != "hashed" {
		t.Fatalf("the example's VM is its pod's: %v %+v", err, r.Binding)
	}
	if ev, err := shared.VMMismatch(ctx, pod, vm, false); err != nil || ev != nil {
		t.Fatalf("no event for the pod's own VM: %v %+v", err, ev)
	}
	others := map[string][]byte{
		"another pod's name": bytes.Replace(vm, []byte(`"name": "vk-apps-web-0-f8181b"`), []byte(`"name": "vk-apps-db-0-0a1b2c"`), 1),
		"another id":         bytes.Replace(vm, []byte(`"id": "vm-7f3a9c21"`), []byte(`"id": "vm-0a1b2c3d"`), 1),
	}
	for name, other := range others {
		_, err := shared.Plan(ctx, pod, other, Overrides{})
		var e *Error
		if !errors.As(err, &e) || e.Code != CodeVMMismatch || e.PlanFailed() || e.Retryable() {
			t.Fatalf("%s: want CodeVMMismatch, got %v", name, err)
		}
		ev, err := shared.VMMismatch(ctx, pod, other, false)
		if err != nil || ev == nil || ev.Reason != "PostCloneVMMismatch" || ev.Type != "Warning" {
			t.Fatalf("%s: the mismatch event: %v %+v", name, err, ev)
		}
		if strings.Contains(ev.Message, "db-0") || strings.Contains(ev.Message, "0a1b2c3d") {
			t.Fatalf("%s: the event names the other VM: %s", name, ev.Message)
		}
	}
}

func withAnnotations(t *testing.T, pairs map[string]string, deleting bool) []byte {
	pod := map[string]any{
		"kind":     "Pod",
		"metadata": map[string]any{"name": "web-0", "namespace": "apps", "uid": "u", "annotations": pairs},
	}
	if deleting {
		pod["metadata"].(map[string]any)["deletionTimestamp"] = "2026-12-01T00:00:00Z"
	}
	b, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Spec section 8's table, as the daemon decides it.
func TestDecide(t *testing.T) {
	managed := "cocoonset.cocoonstack.io/managed"
	mode := "cocoonset.cocoonstack.io/mode"
	cases := []struct {
		name     string
		ann      map[string]string
		deleting bool
		needed   bool
		want     Decision
		gate     Action
	}{
		{"fresh clone", map[string]string{managed: "true", mode: "clone"}, false, true, Decision{Action: RunLoop, Op: "post_clone"}, NeedsFacts},
		{"nothing to fix", map[string]string{managed: "true", mode: "clone"}, false, false, Decision{Action: IPWaitOnly, Op: "ready_wait"}, NeedsFacts},
		{"done", map[string]string{managed: "true", mode: "clone", KeyPostCloneState: "done"}, false, true, Decision{Action: IPWaitOnly, Op: "ready_wait", Marker: "done"}, NeedsFacts},
		{"running", map[string]string{managed: "true", mode: "clone", KeyPostCloneState: "running"}, false, true, Decision{Action: RunLoop, Op: "post_clone", Marker: "running"}, NeedsFacts},
		{"failed parks", map[string]string{managed: "true", mode: "clone", KeyPostCloneState: "failed"}, false, true, Decision{Action: Parked}, Parked},
		{"hibernating", map[string]string{managed: "true", mode: "clone", KeyLifecycleState: "hibernating"}, false, true, Decision{Action: Nothing, Why: "stack-owns"}, Nothing},
		{"hibernate asked", map[string]string{managed: "true", mode: "clone", "vm.cocoonstack.io/hibernate": "true"}, false, true, Decision{Action: Nothing, Why: "hibernate-requested"}, Nothing},
		{"deleting", map[string]string{managed: "true", mode: "clone"}, true, true, Decision{Action: Nothing, Why: "deleting"}, Nothing},
		{"not managed", map[string]string{mode: "clone"}, false, true, Decision{Action: Nothing, Why: "not-managed"}, Nothing},
		{"not a clone", map[string]string{managed: "true", mode: "run"}, false, true, Decision{Action: Nothing, Why: "not-cloned"}, Nothing},
	}
	for _, c := range cases {
		pod := withAnnotations(t, c.ann, c.deleting)
		got, err := shared.Decide(ctx, pod, c.needed)
		if err != nil || got != c.want {
			t.Errorf("%s: Decide = %+v, %v; want %+v", c.name, got, err, c.want)
		}
		gate, err := shared.Gate(ctx, pod)
		if err != nil || gate.Action != c.gate {
			t.Errorf("%s: Gate = %+v, %v; want %s", c.name, gate, err, c.gate)
		}
	}
	if _, err := shared.Decide(ctx, []byte("[]"), true); err == nil {
		t.Error("a JSON list is not a pod")
	}
}

// guestStderr is what a guest prints while it runs `steps` steps of an
// attempt and fails step `failAt` (0: none fail) with exit 3.
func guestStderr(nonce string, steps, failAt int, noise string) []byte {
	var b strings.Builder
	for i := 1; i <= steps; i++ {
		fmt.Fprintf(&b, "\ncocoon-fixup: %s step %d/%d start\n", nonce, i, steps)
		if i == failAt {
			b.WriteString(noise)
			fmt.Fprintf(&b, "\ncocoon-fixup: %s step %d/%d failed exit 3\n", nonce, i, steps)
			return []byte(b.String())
		}
	}
	fmt.Fprintf(&b, "\ncocoon-fixup: %s done\n", nonce)
	return []byte(b.String())
}

// An attempt's argv carries a fresh nonce; the verdict trusts only that
// nonce's markers and names the failed step.
func TestAttemptsAndVerdicts(t *testing.T) {
	pod := read(t, filepath.Join(root, "examples", "oci-static", "pod.json"))
	vm := read(t, filepath.Join(root, "examples", "oci-static", "vm.json"))
	r, err := shared.Plan(ctx, pod, vm, Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	a, err := shared.NewAttempt(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	b, err := shared.NewAttempt(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Nonce) != 32 || a.Nonce == b.Nonce || a.Argv[len(a.Argv)-1] != a.Nonce {
		t.Fatalf("nonces: %q %q, argv ends %q", a.Nonce, b.Nonce, a.Argv[len(a.Argv)-1])
	}
	if !reflect.DeepEqual(a.Argv[:len(r.Exec)], r.Exec) || !reflect.DeepEqual(a.Argv[len(r.Exec):], []string{"sh", a.Nonce}) {
		t.Fatalf("the argv is the report's exec and the nonce:\n%q\n%q", a.Argv, r.Exec)
	}
	steps := len(r.Steps)
	v, err := a.Judge(ctx, ExecResult{Stderr: guestStderr(a.Nonce, steps, 0, "")})
	if err != nil || !v.OK {
		t.Fatalf("a complete run: %+v %v", v, err)
	}
	// Another exec's done marker proves nothing.
	v, err = a.Judge(ctx, ExecResult{Stderr: guestStderr(b.Nonce, steps, 0, "")})
	if err != nil || v.OK || !strings.Contains(v.Error, "no step markers of this exec") {
		t.Fatalf("a forged done marker was taken: %+v %v", v, err)
	}
	v, err = a.Judge(ctx, ExecResult{ExitCode: 3, Stderr: guestStderr(a.Nonce, steps, 2, "networkctl: boom")})
	if err != nil || v.OK || v.Failure == nil || v.Failure.Kind != "step" || *v.Failure.Step != 2 || !strings.Contains(v.Failure.Stderr, "boom") {
		t.Fatalf("a failed step: %+v %v", v, err)
	}
	if !strings.Contains(v.Error, "step 2/") || !strings.Contains(v.Error, "boom") {
		t.Fatalf("the error line names the step and its stderr: %q", v.Error)
	}
	v, err = a.Judge(ctx, ExecResult{Signal: 9})
	if err != nil || v.OK || !strings.Contains(v.Error, "signal 9") {
		t.Fatalf("a killed exec: %+v %v", v, err)
	}
	// A plan that cannot be a report's is refused.
	bad := *r
	bad.plan = []byte(`{"dialect":"posix-sh","steps":[{"description":"x","phase":"prepare","best_effort":false,"run":["sh\u0000"]}],"vm_id":"vm-7f3a9c21","seal":"00"}`)
	if _, err := shared.NewAttempt(ctx, &bad); err == nil {
		t.Fatal("a hand-made plan was attempted")
	}
	none, err := shared.Plan(ctx, read(t, filepath.Join(root, "examples", "no-fixup", "pod.json")), read(t, filepath.Join(root, "examples", "no-fixup", "vm.json")), Overrides{})
	if err != nil || none.NeedsFixup {
		t.Fatalf("no-fixup: %v %+v", err, none)
	}
	if _, err := shared.NewAttempt(ctx, none); err == nil {
		t.Fatal("a report without a plan was attempted")
	}
}

// The values the loop writes are the daemon's, limits included.
func TestAnnotationValues(t *testing.T) {
	var chain []string
	for i := 1; i <= 200; i++ {
		chain = append(chain, fmt.Sprintf("attempt %d: é%s", i, strings.Repeat("x", 40)))
	}
	value, err := shared.ErrorsAnnotation(ctx, chain)
	if err != nil || len(value) > 4096 || !strings.HasPrefix(value, "[truncated: first ") || !strings.HasSuffix(value, chain[199]) {
		t.Fatalf("errors annotation (%d bytes): %v", len(value), err)
	}
	short, err := shared.ErrorsAnnotation(ctx, []string{"attempt 1: boom"})
	if err != nil || short != "attempt 1: boom" {
		t.Fatalf("%q %v", short, err)
	}
	msg, err := shared.EventMessage(ctx, strings.Repeat("é", 400))
	if err != nil || len(msg) > 512 || !strings.HasSuffix(msg, "[truncated]") {
		t.Fatalf("event message (%d bytes) %v", len(msg), err)
	}
	line, err := shared.OneLine(ctx, "first\nsecond\x1b[31m")
	if err != nil || strings.ContainsAny(line, "\n\x1b") || !strings.Contains(line, "first | second") {
		t.Fatalf("one line: %q %v", line, err)
	}
	rec, err := shared.AttemptFailed(ctx, 2, "step 1/3 (Write) failed")
	if err != nil || rec.Line != "attempt 2: step 1/3 (Write) failed" || rec.Event.Reason != "PostCloneExecAttemptFailed" {
		t.Fatalf("attempt failed: %+v %v", rec, err)
	}
	rec, err = shared.Succeeded(ctx, "oci-networkd", 2)
	if err != nil || rec.Event.Message != "kind=linux_static attempts=2 scenario=oci-networkd" || *rec.Patch[KeyPostCloneState] != "done" {
		t.Fatalf("succeeded: %+v %v", rec, err)
	}
	pod := read(t, filepath.Join(root, "examples", "oci-static", "pod.json"))
	vm := read(t, filepath.Join(root, "examples", "oci-static", "vm.json"))
	r, err := shared.Plan(ctx, pod, vm, Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	current := map[string]string{"cocoonset.cocoonstack.io/generation": "3"}
	rec, err = shared.Exhausted(ctx, current, r, "create", []string{"attempt 59: exited 2", "attempt 60: exited 1"})
	if err != nil {
		t.Fatal(err)
	}
	joined := "attempt 59: exited 2\nattempt 60: exited 1"
	if *rec.Patch[KeyPostCloneHint] != r.HintValue() || *rec.Patch[KeyPostCloneErrors] != joined ||
		*rec.Patch[KeyLifecycleState] != "failed" || *rec.Patch[KeyLifecycleMessage] != joined || rec.HintLeftOut != nil {
		t.Fatalf("exhausted record: %+v", rec.Patch)
	}
	if rec.Event.Message != "create: "+joined {
		t.Fatalf("exhausted event: %q", rec.Event.Message)
	}
	// A pod whose annotations leave no room for the hint gets the record
	// without it, and the chain says so.
	full := map[string]string{"example.com/big": strings.Repeat("x", 256*1024-2000)}
	rec, err = shared.Exhausted(ctx, full, r, "reconcile", []string{"attempt 1: exited 1"})
	if err != nil || rec.HintLeftOut == nil || rec.Patch[KeyPostCloneHint] != nil || len(rec.Errors) != 2 {
		t.Fatalf("exhausted without room: %+v %v", rec, err)
	}
	rec, err = shared.IPWaitTimeout(ctx, map[string]string{}, "vk-apps-web-0-f8181b", 45*time.Second)
	want := "clone vk-apps-web-0-f8181b: dhcp lease not observed within 45s"
	if err != nil || rec.Event.Message != want || *rec.Patch[KeyLifecycleState] != "failed" || *rec.Patch[KeyLifecycleMessage] != want {
		t.Fatalf("ip wait timeout: %+v %v", rec, err)
	}
	patch, err := shared.Ready(ctx, map[string]string{}, []byte{10, 88, 4, 21})
	if err != nil || *patch[KeyIP] != "10.88.4.21" || *patch[KeyLifecycleState] != "ready" {
		t.Fatalf("ready: %+v %v", patch, err)
	}
	// Before a final write the pod is read again: a pod the stack has taken
	// over, or another incarnation, gets nothing.
	podJSON := read(t, filepath.Join(root, "examples", "oci-static", "pod.json"))
	uid := "5b7e0c2a-6f1d-4e8b-9c3a-1f2d4e6a8b01"
	for name, c := range map[string]struct {
		pod  []byte
		uid  string
		vm   string
		want bool
	}{
		"as it was":        {podJSON, uid, "vm-7f3a9c21", true},
		"recreated":        {podJSON, "another-uid", "vm-7f3a9c21", false},
		"another VM":       {podJSON, uid, "vm-00000001", false},
		"failed lifecycle": {bytes.Replace(podJSON, []byte(`"cocoonset.cocoonstack.io/managed": "true",`), []byte(`"cocoonset.cocoonstack.io/managed": "true", "vm.cocoonstack.io/lifecycle-state": "failed",`), 1), uid, "vm-7f3a9c21", false},
		"hibernating":      {bytes.Replace(podJSON, []byte(`"cocoonset.cocoonstack.io/managed": "true",`), []byte(`"cocoonset.cocoonstack.io/managed": "true", "vm.cocoonstack.io/hibernate": "true",`), 1), uid, "vm-7f3a9c21", false},
	} {
		got, err := shared.StillOurs(ctx, c.pod, c.uid, c.vm)
		if err != nil || got != c.want {
			t.Errorf("StillOurs, %s: %v %v, want %v", name, got, err, c.want)
		}
	}
	ev, err := shared.Resumed(ctx, "post_clone")
	if err != nil || ev.Reason != "ResumedAfterRestart" || ev.Message != "op=post_clone" {
		t.Fatalf("resumed: %+v %v", ev, err)
	}
	if _, err := shared.StatePatch(ctx, "finished"); err == nil {
		t.Fatal("an unknown state was taken")
	}
}

// More goroutines than plugin slots wait for one instead of failing.
func TestCallersQueueForSlots(t *testing.T) {
	p, err := NewPlanner(ctx, Options{NoPluginDir: true, NoCache: true, Limits: Limits{Slots: 2}, CocoonRoot: filepath.Join(root, "examples", "cocoon-root")})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	pod := read(t, filepath.Join(root, "examples", "oci-static", "pod.json"))
	vm := read(t, filepath.Join(root, "examples", "oci-static", "vm.json"))
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 5; i++ {
				if _, err := p.Plan(ctx, pod, vm, Overrides{}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// Only a plan the planner made, unchanged, is rendered into an exec.
func TestAttemptsTakeOnlySealedPlans(t *testing.T) {
	pod := read(t, filepath.Join(root, "examples", "oci-static", "pod.json"))
	vm := read(t, filepath.Join(root, "examples", "oci-static", "vm.json"))
	r, err := shared.Plan(ctx, pod, vm, Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	tampered := *r
	tampered.plan = bytes.Replace(r.plan, []byte("systemd-networkd"), []byte("evil-networkd"), 1)
	if bytes.Equal(tampered.plan, r.plan) {
		t.Fatal("the test did not change the plan")
	}
	var e *Error
	if _, err := shared.NewAttempt(ctx, &tampered); !errors.As(err, &e) || e.Code != CodeInvalidArgument || !strings.Contains(e.Message, "seal") {
		t.Fatalf("a changed plan: %v", err)
	}
	unsealed := *r
	unsealed.plan = bytes.Replace(r.plan, []byte(`"seal"`), []byte(`"other"`), 1)
	if _, err := shared.NewAttempt(ctx, &unsealed); !errors.As(err, &e) || e.Code != CodeInvalidArgument || !strings.Contains(e.Message, "no seal") {
		t.Fatalf("a plan without its seal: %v", err)
	}
	elsewhere := *r
	elsewhere.plan = bytes.Replace(r.plan, []byte(`"vm-7f3a9c21"`), []byte(`"vm-0a1b2c3d"`), 1)
	if _, err := shared.NewAttempt(ctx, &elsewhere); !errors.As(err, &e) || !strings.Contains(e.Message, "seal does not match") {
		t.Fatalf("the plan for another VM: %v", err)
	}
	other, err := NewPlanner(ctx, Options{NoPluginDir: true, NoCache: true, CocoonRoot: filepath.Join(root, "examples", "cocoon-root")})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := other.NewAttempt(ctx, r); !errors.As(err, &e) || !strings.Contains(e.Message, "seal does not match") {
		t.Fatalf("another planner's plan: %v", err)
	}
	a, err := shared.NewAttempt(ctx, r)
	if err != nil || a.VMID != "vm-7f3a9c21" {
		t.Fatalf("the plan as made: %v %+v", err, a)
	}
}

// Close while other goroutines plan: each call either finishes or sees
// ErrClosed, and every goroutine ends with ErrClosed. (The race detector
// sees the Go side; a call on a freed planner would crash the library.)
func TestCloseWhileCallsAreInFlight(t *testing.T) {
	p, err := NewPlanner(ctx, Options{NoPluginDir: true, NoCache: true, CocoonRoot: filepath.Join(root, "examples", "cocoon-root")})
	if err != nil {
		t.Fatal(err)
	}
	pod := read(t, filepath.Join(root, "examples", "oci-static", "pod.json"))
	vm := read(t, filepath.Join(root, "examples", "oci-static", "vm.json"))
	var wg sync.WaitGroup
	var mu sync.Mutex
	done, closed, exited := 0, 0, 0
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer func() {
				mu.Lock()
				exited++
				mu.Unlock()
				wg.Done()
			}()
			for {
				_, err := p.Plan(ctx, pod, vm, Overrides{})
				mu.Lock()
				if err == ErrClosed {
					closed++
					mu.Unlock()
					return
				}
				if err != nil {
					mu.Unlock()
					t.Errorf("a call beside Close: %v", err)
					return
				}
				done++
				mu.Unlock()
			}
		}()
	}
	for {
		mu.Lock()
		n, gone := done, exited
		mu.Unlock()
		if n >= 16 || gone > 0 {
			break
		}
		runtime.Gosched()
	}
	p.Close()
	wg.Wait()
	if closed != 8 {
		t.Fatalf("%d goroutines saw ErrClosed, want 8", closed)
	}
}

// Close is the contract: calls after it fail cleanly, twice is harmless.
func TestClose(t *testing.T) {
	p, err := NewPlanner(ctx, Options{NoPluginDir: true, CocoonRoot: filepath.Join(root, "examples", "cocoon-root")})
	if err != nil {
		t.Fatal(err)
	}
	pod := read(t, filepath.Join(root, "examples", "oci-static", "pod.json"))
	vm := read(t, filepath.Join(root, "examples", "oci-static", "vm.json"))
	r, err := p.Plan(ctx, pod, vm, Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	p.Close()
	if _, err := p.Plan(ctx, pod, vm, Overrides{}); err != ErrClosed {
		t.Fatalf("after Close: %v", err)
	}
	if _, err := p.NewAttempt(ctx, r); err != ErrClosed {
		t.Fatalf("after Close: %v", err)
	}
}

// rss is the process's resident memory in bytes.
func rss(t testing.TB) int64 {
	return rssOf(t, "self")
}

// rssOf is the resident memory of a process ("self" or a pid).
func rssOf(t testing.TB, pid string) int64 {
	statm, err := os.ReadFile("/proc/" + pid + "/statm")
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(string(statm))
	pages, err := strconv.ParseInt(fields[1], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return pages * int64(os.Getpagesize())
}

// 100,000 plan calls (with their attempts and verdicts) leave resident
// memory where it was after the first few thousand: nothing the library
// returns or holds per call is kept.
func TestMemoryIsFlat(t *testing.T) {
	calls := 100000
	if s := os.Getenv("COCOONFIXUP_MEMORY_CALLS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 10000 {
			t.Fatalf("COCOONFIXUP_MEMORY_CALLS=%q: at least 10000", s)
		}
		calls = n
	}
	exs := examples(t)
	ovr := make([]Overrides, len(exs))
	for i, ex := range exs {
		ovr[i] = overrides(t, ex.args)
	}
	// With the child-process backend the library's memory is the
	// child's: both count.
	sample := func() int64 {
		runtime.GC()
		total := rss(t)
		if child, ok := shared.conn.t.(*process); ok {
			total += rssOf(t, strconv.Itoa(child.cmd.Process.Pid))
		}
		return total
	}
	var samples []int64
	var base int64
	workers := 4
	per := calls / workers
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed error
	step := func(w, i int) {
		k := (w + i) % len(exs)
		r, err := shared.Plan(ctx, exs[k].pod, exs[k].vm, ovr[k])
		if err == nil && r.NeedsFixup {
			var a *Attempt
			if a, err = shared.NewAttempt(ctx, r); err == nil {
				_, err = a.Judge(ctx, ExecResult{ExitCode: 1, Stderr: []byte("boom")})
			}
		}
		if err != nil {
			mu.Lock()
			failed = err
			mu.Unlock()
		}
	}
	warm := per / 20
	for round := 0; round < 20; round++ {
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				for i := 0; i < warm; i++ {
					step(w, round*warm+i)
				}
			}(w)
		}
		wg.Wait()
		if failed != nil {
			t.Fatal(failed)
		}
		s := sample()
		if round == 1 {
			base = s
		}
		samples = append(samples, s)
	}
	growth := samples[len(samples)-1] - base
	t.Logf("%d calls; RSS after each 5%%: %v MiB; growth after the first 10%%: %d KiB", calls, mib(samples), growth>>10)
	// A leak of one returned report per call would be hundreds of MiB, of
	// one verdict string (200 bytes) about 20 MiB.
	if growth > 16<<20 {
		t.Fatalf("resident memory grew by %d MiB over %d calls after warm-up: %v MiB", growth>>20, calls, mib(samples))
	}
}

func mib(xs []int64) []int64 {
	out := make([]int64, len(xs))
	for i, x := range xs {
		out[i] = x >> 20
	}
	return out
}
