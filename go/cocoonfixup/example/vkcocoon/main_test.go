package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cocoonstack/cocoon-fixup/go/cocoonfixup"
	"github.com/cocoonstack/cocoon-fixup/go/cocoonfixup/example/vkcocoon/provider"
)

var examples = filepath.Join("..", "..", "..", "..", "examples")

func planner(t *testing.T) *cocoonfixup.Planner {
	p, err := cocoonfixup.NewPlanner(context.Background(), cocoonfixup.Options{
		CocoonRoot: filepath.Join(examples, "cocoon-root"), NoPluginDir: true,
		CacheDir: filepath.Join(t.TempDir(), "cache"), CacheKey: filepath.Join(t.TempDir(), "key"),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

type outcomes struct {
	mu  sync.Mutex
	out map[string]*cocoonfixup.Outcome
	err map[string]error
}

func (o *outcomes) done(pod string, out *cocoonfixup.Outcome, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.out[pod], o.err[pod] = out, err
}

func setup(t *testing.T, guest *Guest) (*provider.Provider, *API, [][]byte, *outcomes) {
	api := &API{W: io.Discard}
	pods, err := Examples(examples, api, guest)
	if err != nil {
		t.Fatal(err)
	}
	got := &outcomes{out: map[string]*cocoonfixup.Outcome{}, err: map[string]error{}}
	p := &provider.Provider{Planner: planner(t), Cocoon: guest, API: api, Leases: &Leases{},
		Settings: cocoonfixup.Settings{RetryInterval: 10 * time.Millisecond}, Done: got.done,
		Records: &provider.Records{}, Admission: cocoonfixup.NewAdmission(2)}
	return p, api, pods, got
}

// Every bundled example through CreatePod, one goroutine each: the
// fixups are done after one failed attempt, the IPs published, the pod
// that is not managed left alone.
func TestProviderFlow(t *testing.T) {
	guest := &Guest{Records: map[string][]byte{}, FailFirst: 1}
	p, api, pods, got := setup(t, guest)
	for _, pod := range pods {
		if err := p.CreatePod(pod); err != nil {
			t.Fatal(err)
		}
	}
	p.Wait()
	want := map[string]string{
		"apps/db-1":       "fixup",
		"apps/web-0":      "fixup",
		"apps/worker-2":   "fixup",
		"desktops/desk-0": "fixup",
		"apps/api-3":      "ip-wait",
		"default/batch-0": "nothing",
	}
	for pod, action := range want {
		if err := got.err[pod]; err != nil {
			t.Errorf("%s: %v", pod, err)
			continue
		}
		out := got.out[pod]
		if out == nil {
			t.Errorf("%s: no outcome (have %v)", pod, got.out)
			continue
		}
		if string(out.Action) != action {
			t.Errorf("%s: action %q, want %q (%s)", pod, out.Action, action, out.Summary)
		}
		if action == "fixup" && (out.Fixup != "done" || out.Readiness != "ready" || out.IP == "") {
			t.Errorf("%s: %s", pod, out.Summary)
		}
	}
	if s := api.Annotation("apps", "web-0", cocoonfixup.KeyPostCloneState); s != "done" {
		t.Errorf("web-0 post-clone-state %q", s)
	}
	if s := api.Annotation("default", "batch-0", cocoonfixup.KeyLifecycleState); s != "" {
		t.Errorf("the unmanaged pod was written: %q", s)
	}
}

// DeletePod cancels the step: the exec under way is abandoned, nothing is
// marked failed, the work stays `running` for a later start.
func TestDeletePodCancelsTheStep(t *testing.T) {
	guest := &Guest{Records: map[string][]byte{}, Block: true}
	p, api, pods, got := setup(t, guest)
	_ = pods
	web, _ := api.Get(context.Background(), "apps", "web-0")
	if web == nil {
		t.Fatal("no web-0 example")
	}
	if err := p.CreatePod(web); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for api.Annotation("apps", "web-0", cocoonfixup.KeyPostCloneState) != "running" {
		if time.Now().After(deadline) {
			t.Fatal("the step never marked the pod running")
		}
		time.Sleep(5 * time.Millisecond)
	}
	p.DeletePod(uid(t, api, "apps", "web-0"))
	p.Wait()
	out := got.out["apps/web-0"]
	// The cancel is the provider's own: Run says so beside the outcome.
	if err := got.err["apps/web-0"]; !errors.Is(err, context.Canceled) || out == nil {
		t.Fatalf("%v %v, want the outcome with the cancel's error", out, err)
	}
	if out.Fixup != "shutdown" {
		t.Errorf("fixup %q: %s", out.Fixup, out.Summary)
	}
	if s := api.Annotation("apps", "web-0", cocoonfixup.KeyPostCloneState); s != "running" {
		t.Errorf("post-clone-state %q after a cancel, want running", s)
	}
}

// The provider's start hands every pod to Run: work left running resumes,
// and a pod never started gets its work, each announced.
func TestReconcileResumesRunningWork(t *testing.T) {
	guest := &Guest{Records: map[string][]byte{}}
	p, api, _, got := setup(t, guest)
	leftRunning(t, api, "apps", "web-0")
	var all [][]byte
	for _, name := range []string{"web-0", "db-1"} {
		pod, _ := api.Get(context.Background(), "apps", name)
		all = append(all, pod)
	}
	if err := p.Reconcile(all); err != nil {
		t.Fatal(err)
	}
	p.Wait()
	if out := got.out["apps/web-0"]; out == nil || out.Fixup != "done" {
		t.Fatalf("web-0: %v %v", out, got.err["apps/web-0"])
	}
	// db-1 was never started: at the provider's start it is new work.
	if out := got.out["apps/db-1"]; out == nil || out.Fixup != "done" {
		t.Errorf("db-1: %v %v", out, got.err["apps/db-1"])
	}
	// Every pod with work at the start announces it (the daemon's startup
	// reconciliation does the same).
	if resumed := resumedEvents(api); resumed != 2 {
		t.Errorf("%d ResumedAfterRestart events, want 2 (web-0's and db-1's): %+v", resumed, api.Events)
	}
}

// leftRunning marks the pod's work `running`, as a provider that
// stopped mid-fixup leaves it.
func leftRunning(t *testing.T, api *API, namespace, name string) {
	running := "running"
	if _, err := api.PatchAnnotations(context.Background(), namespace, name, cocoonfixup.PodPatch{
		Annotations: cocoonfixup.Patch{cocoonfixup.KeyPostCloneState: &running}, UID: uid(t, api, namespace, name),
	}); err != nil {
		t.Fatal(err)
	}
}

// resumedEvents counts the ResumedAfterRestart events recorded.
func resumedEvents(api *API) int {
	n := 0
	for _, e := range api.Events {
		if e.Reason == cocoonfixup.ReasonResumedAfterRestart {
			n++
		}
	}
	return n
}

func uid(t *testing.T, api *API, namespace, name string) string {
	pod, _ := api.Get(context.Background(), namespace, name)
	var m provider.Meta
	if err := json.Unmarshal(pod, &m); err != nil {
		t.Fatal(err)
	}
	return m.Metadata.UID
}

// A step the node keeps from finishing is tried again, after the wait
// the stop says (a second for the first), while the pod is the same pod:
// once another pod holds its name (a new uid), the retries stop, and the
// new pod's own CreatePod runs its step.
func TestRetriesStopWhenThePodIsReplaced(t *testing.T) {
	guest := &Guest{Records: map[string][]byte{}}
	p, api, _, got := setup(t, guest)
	// No VM records (setup filled them): every inspect fails, a
	// retryable stop.
	guest.Records = map[string][]byte{}
	web, _ := api.Get(context.Background(), "apps", "web-0")
	if web == nil {
		t.Fatal("no web-0 example")
	}
	first := uid(t, api, "apps", "web-0")
	if err := p.CreatePod(web); err != nil {
		t.Fatal(err)
	}
	var replaced map[string]any
	if err := json.Unmarshal(web, &replaced); err != nil {
		t.Fatal(err)
	}
	replaced["metadata"].(map[string]any)["uid"] = "a-new-pod-of-the-name"
	again, _ := json.Marshal(replaced)
	if err := api.Add(again); err != nil {
		t.Fatal(err)
	}
	ended := make(chan struct{})
	go func() { p.Wait(); close(ended) }()
	select {
	case <-ended:
	case <-time.After(60 * time.Second):
		p.DeletePod(first)
		t.Fatal("the retries went on for a pod that was replaced")
	}
	// Either the node's failure was the last word, or the Run met the
	// new pod first and left it to its own step.
	switch out, err := got.out["apps/web-0"], got.err["apps/web-0"]; {
	case errors.Is(err, cocoonfixup.ErrRetryable):
	case err == nil && out != nil && out.Action == "gone":
	default:
		t.Errorf("the last Run: %+v %v", out, err)
	}
}

// A startup's step that stops before anything was told (its inspect
// failed) is tried again as the stop says: after its wait, still as a
// startup, so the resumed work is announced once, on the try that gets
// to it.
func TestARetryKeepsTheStopsTrigger(t *testing.T) {
	guest := &Guest{Records: map[string][]byte{}, InspectFailFirst: 1}
	p, api, _, got := setup(t, guest)
	leftRunning(t, api, "apps", "web-0")
	web, _ := api.Get(context.Background(), "apps", "web-0")
	started := time.Now()
	if err := p.Reconcile([][]byte{web}); err != nil {
		t.Fatal(err)
	}
	p.Wait()
	if out, err := got.out["apps/web-0"], got.err["apps/web-0"]; err != nil || out == nil || out.Fixup != "done" {
		t.Fatalf("web-0 after the retry: %+v %v", out, err)
	}
	// The first stop's wait, as the library gives it.
	if waited := time.Since(started); waited < time.Second {
		t.Errorf("the retry came %v after the start, before the stop's wait of 1s", waited)
	}
	guest.mu.Lock()
	inspects := guest.inspects
	guest.mu.Unlock()
	if inspects != 2 {
		t.Errorf("%d inspects, want the failed one and the retry's", inspects)
	}
	if resumed := resumedEvents(api); resumed != 1 {
		t.Errorf("%d ResumedAfterRestart events, want the retry's one: %+v", resumed, api.Events)
	}
}

// A hibernation the provider's watch saw (ObservePod) makes the VM after
// it a wake: the Cloud Hypervisor Windows pod gets the IP wait alone, no
// PnP. Without the observations the same pod gets its PnP fixup.
func TestAnObservedHibernationSparesTheWakeItsPnP(t *testing.T) {
	for _, observed := range []bool{true, false} {
		guest := &Guest{Records: map[string][]byte{}}
		p, _, pods, got := setup(t, guest)
		p.Settings.WakeGrace = 100 * time.Millisecond
		var desk []byte
		for _, pod := range pods {
			var m provider.Meta
			if json.Unmarshal(pod, &m) == nil && m.Metadata.Name == "desk-0" {
				desk = pod
			}
		}
		if desk == nil {
			t.Fatal("the windows example is missing")
		}
		// desk-0 as the watch showed it before: on VM id `id` (none when
		// empty) in lifecycle state `lifecycle`.
		seen := func(id, lifecycle string) []byte {
			var doc map[string]any
			json.Unmarshal(desk, &doc)
			annotations := doc["metadata"].(map[string]any)["annotations"].(map[string]any)
			delete(annotations, cocoonfixup.KeyVMID)
			if id != "" {
				annotations[cocoonfixup.KeyVMID] = id
			}
			annotations[cocoonfixup.KeyLifecycleState] = lifecycle
			out, _ := json.Marshal(doc)
			return out
		}
		if observed {
			for i, step := range []struct {
				pod  []byte
				live bool
			}{{seen("vm-5e1f0a22", "running"), false}, {seen("", "hibernated"), true}, {desk, true}} {
				if err := p.ObservePod(context.Background(), step.pod, step.live); err != nil {
					t.Fatalf("observation %d: %v", i, err)
				}
			}
		}
		if err := p.CreatePod(desk); err != nil {
			t.Fatal(err)
		}
		p.Wait()
		out, err := got.out["desktops/desk-0"], got.err["desktops/desk-0"]
		guest.mu.Lock()
		execs := guest.execs
		guest.mu.Unlock()
		switch {
		case err != nil || out == nil:
			t.Errorf("observed %v: %v %v", observed, out, err)
		case observed && (out.Action != "ip-wait" || execs != 0):
			t.Errorf("observed: %d execs, %s; want the IP wait alone", execs, out.Summary)
		case !observed && (out.Action != "fixup" || execs == 0):
			t.Errorf("not observed: %d execs, %s; want the PnP fixup", execs, out.Summary)
		}
	}
}

// A parent prepared before its snapshot: one exec, the annotation naming
// the plugin, carried on to its clones; a second preparation is harmless;
// a Windows parent has nothing to prepare.
func TestPrepareParent(t *testing.T) {
	guest := &Guest{Records: map[string][]byte{}, FailFirst: 1}
	p, api, pods, _ := setup(t, guest)
	byName := map[string][]byte{}
	for _, pod := range pods {
		var m provider.Meta
		if err := json.Unmarshal(pod, &m); err != nil {
			t.Fatal(err)
		}
		byName[m.Metadata.Namespace+"/"+m.Metadata.Name] = pod
	}
	for round := 1; round <= 2; round++ {
		out, err := p.PrepareParent(context.Background(), byName["apps/web-0"])
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if out.Action != "prepare" || out.Fixup != "done" || !strings.HasPrefix(out.Prepared, "oci-networkd ") {
			t.Fatalf("round %d: %+v", round, out)
		}
		if got := api.Annotation("apps", "web-0", cocoonfixup.KeyPrepared); got != out.Prepared {
			t.Fatalf("round %d: the pod says %q, the outcome %q", round, got, out.Prepared)
		}
	}
	now, err := api.Get(context.Background(), "apps", "web-0")
	if err != nil {
		t.Fatal(err)
	}
	carried, err := provider.CloneAnnotations(now)
	if err != nil || !strings.HasPrefix(carried[cocoonfixup.KeyPrepared], "oci-networkd ") {
		t.Fatalf("the clone's annotations: %v %v", carried, err)
	}
	if state := api.Annotation("apps", "web-0", cocoonfixup.KeyPostCloneState); state != "" {
		t.Errorf("a preparation wrote post-clone-state %q", state)
	}
	out, err := p.PrepareParent(context.Background(), byName["desktops/desk-0"])
	if err != nil || out.Action != "nothing" || len(out.Errors) == 0 || out.Prepared != "" {
		t.Fatalf("windows: %+v %v", out, err)
	}
}
