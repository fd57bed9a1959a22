package cocoonfixup

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// exampleFiles are the pod and VM record of a bundled example.
func exampleFiles(t *testing.T, name string) (pod, vm []byte) {
	t.Helper()
	pod, err := os.ReadFile(filepath.Join(root, "examples", name, "pod.json"))
	if err == nil {
		vm, err = os.ReadFile(filepath.Join(root, "examples", name, "vm.json"))
	}
	if err != nil {
		t.Fatal(err)
	}
	return pod, vm
}

// examplesPlanner is a planner of backend over the examples' cocoon root,
// with a cache of its own.
func examplesPlanner(t *testing.T, backend Backend) *Planner {
	t.Helper()
	dir := t.TempDir()
	p, err := NewPlanner(ctx, Options{Backend: backend, NoPluginDir: true,
		CocoonRoot: filepath.Join(root, "examples", "cocoon-root"),
		CacheDir:   filepath.Join(dir, "cache"), CacheKey: filepath.Join(dir, "key")})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// memoryRecords keeps records in memory, by uid.
type memoryRecords struct {
	mu   sync.Mutex
	byID map[string]json.RawMessage
}

func (m *memoryRecords) Load(ctx context.Context, uid string) (json.RawMessage, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.byID[uid], nil
}

func (m *memoryRecords) Store(ctx context.Context, uid string, record json.RawMessage) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.byID == nil {
		m.byID = map[string]json.RawMessage{}
	}
	m.byID[uid] = append(json.RawMessage(nil), record...)
	return nil
}

// countingVM answers its record and counts the execs, each a success.
type countingVM struct {
	record []byte
	execs  *atomic.Int32
}

func (v countingVM) Inspect(ctx context.Context, vm string, timeout time.Duration) ([]byte, error) {
	return v.record, nil
}

func (v countingVM) Exec(ctx context.Context, vm string, argv []string, timeout time.Duration) (ExecResult, error) {
	v.execs.Add(1)
	return ExecResult{}, nil
}

// A hibernation and the wake after it, seen through Observe, make the
// woken Cloud Hypervisor Windows VM a wake for Run (the hibernate
// history, spec section 2 rule 3): no PnP exec, the IP wait at once.
// Without the history the same pod waits the grace and gets its PnP.
func TestAnObservedHibernationMakesTheNextVMAWake(t *testing.T) {
	podFile, vm := exampleFiles(t, "windows")
	// The pod as the watch shows it: with VM id `id` (none when empty)
	// and lifecycle state `lifecycle`.
	pod := func(id, lifecycle string) []byte {
		var doc map[string]any
		if err := json.Unmarshal(podFile, &doc); err != nil {
			t.Fatal(err)
		}
		annotations := doc["metadata"].(map[string]any)["annotations"].(map[string]any)
		delete(annotations, "vm.cocoonstack.io/id")
		if id != "" {
			annotations["vm.cocoonstack.io/id"] = id
		}
		if lifecycle != "" {
			annotations["vm.cocoonstack.io/lifecycle-state"] = lifecycle
		}
		out, _ := json.Marshal(doc)
		return out
	}
	for _, backend := range backends(t) {
		p := examplesPlanner(t, backend)
		run := func(records Records, watched bool) (*Outcome, int32) {
			var execs atomic.Int32
			out, err := p.Run(ctx, pod("vm-9a24d6b3", ""), countingVM{vm, &execs}, stillPods{pod("vm-9a24d6b3", "")}, RunOptions{
				Records: records, WatchedSinceNew: watched, Leases: leaseThen(func() {}),
				Settings: Settings{WakeGrace: 200 * time.Millisecond},
			})
			if err != nil {
				t.Fatalf("%s: %v", backend, err)
			}
			return out, execs.Load()
		}

		records := &memoryRecords{}
		watched := false
		for i, seen := range []struct {
			pod  []byte
			live bool
		}{
			{pod("vm-5e1f0a22", "running"), false},
			{pod("", "hibernated"), true},
			{pod("vm-9a24d6b3", ""), true},
		} {
			var err error
			if watched, err = p.Observe(ctx, seen.pod, records, ObserveOptions{Live: seen.live, WatchedSinceNew: watched}); err != nil {
				t.Fatalf("%s: observation %d: %v", backend, i, err)
			}
		}
		out, execs := run(records, watched)
		if execs != 0 || out.Action != "ip-wait" || out.Readiness != "ready" {
			t.Errorf("%s: with the history: %d execs, %+v; want the IP wait alone", backend, execs, out)
		}
		out, execs = run(&memoryRecords{}, false)
		if execs == 0 || out.Action != "fixup" || out.Fixup != "done" {
			t.Errorf("%s: without it: %d execs, %+v; want the PnP fixup", backend, execs, out)
		}

		if _, err := p.Observe(ctx, []byte(`{"metadata": {"name": "x"}}`), records, ObserveOptions{Live: true}); err == nil {
			t.Errorf("%s: a pod without a uid was observed", backend)
		}
		p.Close()
	}
}

// observingVM notes a hibernation of the pod through Observe while the
// fixup's exec runs, as a watch would see it meanwhile.
type observingVM struct {
	countingVM
	observe func()
}

func (v observingVM) Exec(ctx context.Context, vm string, argv []string, timeout time.Duration) (ExecResult, error) {
	v.observe()
	return v.countingVM.Exec(ctx, vm, argv, timeout)
}

// What Observe notes while a Run is under way stays when the Run keeps
// its own record afterwards: each keeps the other's part of it.
func TestRunKeepsWhatObserveNotedMeanwhile(t *testing.T) {
	pod, vm := exampleFiles(t, "windows")
	var doc map[string]any
	if err := json.Unmarshal(pod, &doc); err != nil {
		t.Fatal(err)
	}
	meta := doc["metadata"].(map[string]any)
	uid := meta["uid"].(string)
	annotations := meta["annotations"].(map[string]any)
	delete(annotations, "vm.cocoonstack.io/id")
	annotations["vm.cocoonstack.io/lifecycle-state"] = "hibernated"
	hibernated, _ := json.Marshal(doc)
	for _, backend := range backends(t) {
		p := examplesPlanner(t, backend)
		records := &memoryRecords{}
		if _, err := p.Observe(ctx, pod, records, ObserveOptions{}); err != nil {
			t.Fatal(err)
		}
		var execs atomic.Int32
		guest := observingVM{countingVM{vm, &execs}, func() {
			if _, err := p.Observe(ctx, hibernated, records, ObserveOptions{Live: true}); err != nil {
				t.Error(err)
			}
		}}
		out, err := p.Run(ctx, pod, guest, stillPods{pod}, RunOptions{Records: records, Leases: leaseThen(func() {}),
			Settings: Settings{WakeGrace: 100 * time.Millisecond}})
		if err != nil || out.Fixup != "done" || execs.Load() != 1 {
			t.Fatalf("%s: %+v %v after %d execs", backend, out, err, execs.Load())
		}
		kept, _ := records.Load(ctx, uid)
		var record struct {
			Hibernated bool `json:"hibernated"`
		}
		if json.Unmarshal(kept, &record) != nil || !record.Hibernated {
			t.Errorf("%s: the hibernation noted during the Run is lost: %s", backend, kept)
		}
		p.Close()
	}
}

// damagedRecords returns what a damaged store holds (bytes that are not
// JSON) and fails every Store when failStore is set.
type damagedRecords struct {
	memoryRecords
	failStore bool
}

func (d *damagedRecords) Store(ctx context.Context, uid string, record json.RawMessage) error {
	if d.failStore {
		return errors.New("the store is read-only")
	}
	return d.memoryRecords.Store(ctx, uid, record)
}

// A record that is not JSON stops neither Observe nor Run: each starts a
// new record in its place (a gap in the watch). A Store that fails is a
// gap too.
func TestADamagedStoreIsAGap(t *testing.T) {
	pod, vm := exampleFiles(t, "windows")
	var doc map[string]any
	if err := json.Unmarshal(pod, &doc); err != nil {
		t.Fatal(err)
	}
	uid := doc["metadata"].(map[string]any)["uid"].(string)
	truncated := json.RawMessage(`{"version": 1, "hibern`)
	for _, backend := range backends(t) {
		p := examplesPlanner(t, backend)
		records := &damagedRecords{}
		records.byID = map[string]json.RawMessage{uid: truncated}
		var execs atomic.Int32
		out, err := p.Run(ctx, pod, countingVM{vm, &execs}, stillPods{pod}, RunOptions{Records: records,
			WatchedSinceNew: true, Leases: leaseThen(func() {}), Settings: Settings{WakeGrace: 100 * time.Millisecond}})
		if err != nil || out.Fixup != "done" {
			t.Errorf("%s: Run over a damaged record: %+v %v", backend, out, err)
		}
		if kept, _ := records.Load(ctx, uid); !json.Valid(kept) {
			t.Errorf("%s: Run kept no record in the damaged one's place: %s", backend, kept)
		}
		records.byID[uid] = truncated
		watched, err := p.Observe(ctx, pod, records, ObserveOptions{Live: true, WatchedSinceNew: true})
		if err != nil || watched {
			t.Errorf("%s: Observe over a damaged record: watched %v, %v; want a gap and no error", backend, watched, err)
		}
		kept, _ := records.Load(ctx, uid)
		if !json.Valid(kept) || string(kept) == string(truncated) {
			t.Errorf("%s: the damaged record was not replaced: %s", backend, kept)
		}
		records.failStore = true
		records.byID = nil
		watched, err = p.Observe(ctx, pod, records, ObserveOptions{Live: true})
		if err == nil || watched {
			t.Errorf("%s: Observe with a failing Store: watched %v, %v; want a gap and the error", backend, watched, err)
		}
		p.Close()
	}
}
