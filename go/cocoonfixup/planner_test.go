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
			if !reflect.DeepEqual(decode(t, report.JSON()), decode(t, want)) {
				t.Fatalf("the package's report differs from the CLI's\npackage: %s\ncli:     %s", report.JSON(), want)
			}
			var typed Report
			if err := json.Unmarshal(want, &typed); err != nil {
				t.Fatal(err)
			}
			mine := *report
			mine.raw = nil
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

// A hostile plugin's failure reaches Go as a typed error naming it, and
// fails the pod through Run with the plan-failed chain.
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
			pods := &recordingPods{stillPods: stillPods{podC}}
			out, err := p.Run(ctx, podC, stillVM{vmC}, pods, RunOptions{})
			if err != nil || out.Fixup != FixupPlanFailed || len(out.Errors) != 1 || !strings.HasPrefix(out.Errors[0], "no plan could be made: plugin hostile") {
				t.Fatalf("a Run of the pod: %+v %v", out, err)
			}
			if state := pods.last(KeyPostCloneState); state != "failed" {
				t.Fatalf("post-clone-state written %q, want failed", state)
			}
			if len(pods.events) != 1 || pods.events[0].Reason != ReasonPlanFailed || pods.events[0].Type != "Warning" {
				t.Fatalf("events %+v", pods.events)
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

// A VM that is not the pod's is refused before anything looks at it (the
// event Run records for it, which never names the other VM, is the
// conformance suite's bind-other-vm and bind-id-disagrees).
func TestBindingVerdict(t *testing.T) {
	pod := read(t, filepath.Join(root, "examples", "oci-static", "pod.json"))
	vm := read(t, filepath.Join(root, "examples", "oci-static", "vm.json"))
	r, err := shared.Plan(ctx, pod, vm, Overrides{})
	if err != nil || !r.Bound() || r.Binding.Form != "hashed" {
		t.Fatalf("the example's VM is its pod's: %v %+v", err, r.Binding)
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
	}
}

// guestStderr is what a guest prints while it runs `steps` steps of an
// exec marked with nonce and fails step `failAt` (0: none fail) with exit
// 3.
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

// answeringVM's Exec hands each argv to answer.
type answeringVM struct {
	stillVM
	answer func(argv []string) ExecResult
}

func (v answeringVM) Exec(ctx context.Context, vm string, argv []string, timeout time.Duration) (ExecResult, error) {
	return v.answer(argv), nil
}

// Each exec Run makes is the plan's exec with a fresh nonce, and is judged
// by that exec's own markers alone: a failed step is named with its
// stderr, the done marker of an earlier exec replayed proves nothing, a
// killed exec says its signal, and the exec that marks every step of its
// own is done.
func TestEachExecIsJudgedByItsOwnMarkers(t *testing.T) {
	pod := read(t, filepath.Join(root, "examples", "oci-static", "pod.json"))
	vm := read(t, filepath.Join(root, "examples", "oci-static", "vm.json"))
	r, err := shared.Plan(ctx, pod, vm, Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	steps := len(r.Steps)
	var mu sync.Mutex
	var nonces []string
	guest := answeringVM{stillVM{vm}, func(argv []string) ExecResult {
		mu.Lock()
		defer mu.Unlock()
		nonce := argv[len(argv)-1]
		if !reflect.DeepEqual(argv[:len(r.Exec)], r.Exec) || !reflect.DeepEqual(argv[len(r.Exec):], []string{"sh", nonce}) {
			t.Errorf("the argv is not the report's exec and a nonce:\n%q\n%q", argv, r.Exec)
		}
		nonces = append(nonces, nonce)
		switch len(nonces) {
		case 1:
			return ExecResult{ExitCode: 3, Stderr: guestStderr(nonce, steps, 2, "networkctl: boom")}
		case 2:
			return ExecResult{Stderr: guestStderr(nonces[0], steps, 0, "")}
		case 3:
			return ExecResult{Signal: 9}
		}
		return ExecResult{Stderr: guestStderr(nonce, steps, 0, "")}
	}}
	pods := &recordingPods{stillPods: stillPods{pod}}
	quick := Settings{RetryInterval: 10 * time.Millisecond}
	out, err := shared.Run(ctx, pod, guest, pods, RunOptions{Settings: quick, Leases: leaseThen(func() {})})
	if err != nil || out.Fixup != FixupDone || out.Attempts != 4 {
		t.Fatalf("the fourth exec ran every step: %+v %v", out, err)
	}
	seen := map[string]bool{}
	for _, n := range nonces {
		if len(n) != 32 || seen[n] {
			t.Fatalf("the nonces are not fresh: %q", nonces)
		}
		seen[n] = true
	}
	var failed []string
	for _, e := range pods.events {
		if e.Reason == ReasonExecAttemptFailed {
			failed = append(failed, e.Message)
		}
	}
	if len(failed) != 3 {
		t.Fatalf("%d failed attempts told, want 3: %q", len(failed), failed)
	}
	for i, want := range [][]string{{"attempt 1: ", "step 2/", "boom"}, {"attempt 2: ", "no step markers of this exec"}, {"attempt 3: ", "signal 9"}} {
		for _, part := range want {
			if !strings.Contains(failed[i], part) {
				t.Errorf("attempt %d's line %q does not say %q", i+1, failed[i], part)
			}
		}
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
	if _, err := p.Plan(ctx, pod, vm, Overrides{}); err != nil {
		t.Fatal(err)
	}
	p.Close()
	p.Close()
	if _, err := p.Plan(ctx, pod, vm, Overrides{}); err != ErrClosed {
		t.Fatalf("after Close: %v", err)
	}
	if _, err := p.Run(ctx, pod, stillVM{vm}, stillPods{pod}, RunOptions{}); err != ErrClosed {
		t.Fatalf("a Run after Close: %v", err)
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

// 100,000 plan calls leave resident memory where it was after the first
// few thousand: nothing the library returns or holds per call is kept.
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
		_, err := shared.Plan(ctx, exs[k].pod, exs[k].vm, ovr[k])
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
	// A leak of one returned report per call would be hundreds of MiB.
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
