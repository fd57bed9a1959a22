package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cocoonfixup"
)

var examples = filepath.Join("..", "..", "..", "..", "examples")

func options(t *testing.T) cocoonfixup.Options {
	return cocoonfixup.Options{CocoonRoot: filepath.Join(examples, "cocoon-root"), NoCache: true, NoPluginDir: true}
}

func byPod(outcomes []Outcome) map[string]Outcome {
	m := map[string]Outcome{}
	for _, o := range outcomes {
		m[o.Pod] = o
	}
	return m
}

var quick = Budget{Interval: 20 * time.Millisecond, Total: 2 * time.Second, ExecTimeout: time.Second}

// The example's loop over the bundled examples: a guest that fails once
// is repaired on the second attempt; one that always fails exhausts the
// budget with the error chain and the exhausted record.
func TestExampleLoop(t *testing.T) {
	var out bytes.Buffer
	outcomes, err := Run(examples, options(t), 1, quick, &out)
	if err != nil {
		t.Fatal(err)
	}
	got := byPod(outcomes)
	web := got["apps/web-0"]
	if web.Action != "run-loop" || web.Fixup != "done" || web.Attempts != 2 || len(web.Errors) != 1 ||
		!strings.HasPrefix(web.Errors[0], "attempt 1: step 2/") || !strings.Contains(web.Errors[0], "No space left on device") {
		t.Fatalf("oci-static: %+v", web)
	}
	for _, o := range outcomes {
		if o.Action == "run-loop" && o.Fixup != "done" {
			t.Errorf("%s: %+v", o.Pod, o)
		}
	}
	text := out.String()
	for _, want := range []string{`"reason":"PostCloneExecAttemptFailed"`, `"reason":"PostCloneSucceeded"`, `"vm.cocoonstack.io/post-clone-state":"running"`, `"vm.cocoonstack.io/post-clone-state":"done"`, `"action":"nothing not-managed"`} {
		if !strings.Contains(text, want) {
			t.Errorf("the output lacks %s:\n%s", want, text)
		}
	}

	out.Reset()
	short := Budget{Interval: 50 * time.Millisecond, Total: 300 * time.Millisecond, ExecTimeout: time.Second}
	outcomes, err = Run(examples, options(t), 1000, short, &out)
	if err != nil {
		t.Fatal(err)
	}
	web = byPod(outcomes)["apps/web-0"]
	if web.Fixup != "exhausted" || web.Attempts < 2 || len(web.Errors) != web.Attempts {
		t.Fatalf("a guest that never recovers: %+v", web)
	}
	for _, want := range []string{`"reason":"PostCloneExecExhausted"`, `"vm.cocoonstack.io/post-clone-state":"failed"`, `"vm.cocoonstack.io/post-clone-hint":"`, `"vm.cocoonstack.io/post-clone-errors":"attempt 1: step 2/`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the output lacks %s:\n%s", want, out.String())
		}
	}
}

// one runs PostClone for the oci-static example, its pod changed by edit.
func one(t *testing.T, o cocoonfixup.Options, edit func(pod, vm []byte) ([]byte, []byte)) (Outcome, string, *memoryPods) {
	pod, err := os.ReadFile(filepath.Join(examples, "oci-static", "pod.json"))
	if err != nil {
		t.Fatal(err)
	}
	vm, err := os.ReadFile(filepath.Join(examples, "oci-static", "vm.json"))
	if err != nil {
		t.Fatal(err)
	}
	pod, vm = edit(pod, vm)
	p, err := cocoonfixup.NewPlanner(o)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var out bytes.Buffer
	pods := &memoryPods{pods: map[string]map[string]any{}, w: &out}
	name, err := pods.add(pod)
	if err != nil {
		t.Fatal(err)
	}
	guest := &Guest{}
	res, err := PostClone(context.Background(), p, pods, name, vm, guest.Exec, quick)
	if err != nil {
		t.Fatal(err)
	}
	if res.Fixup != "done" && guest.execs != 0 {
		t.Fatalf("%d execs ran for %+v", guest.execs, res)
	}
	return res, out.String(), pods
}

func annotate(extra string) func(pod, vm []byte) ([]byte, []byte) {
	return func(pod, vm []byte) ([]byte, []byte) {
		return bytes.Replace(pod, []byte(`"cocoonset.cocoonstack.io/managed": "true",`), []byte(`"cocoonset.cocoonstack.io/managed": "true", `+extra+`,`), 1), vm
	}
}

// The other ways through the flow: another pod's VM, a plan that cannot
// be made, a fixup already done, a pod the stack has taken over.
func TestExampleFlowEdges(t *testing.T) {
	res, out, _ := one(t, options(t), func(pod, vm []byte) ([]byte, []byte) {
		return pod, bytes.Replace(vm, []byte(`"name": "vk-apps-web-0-f8181b"`), []byte(`"name": "vk-apps-db-0-0a1b2c"`), 1)
	})
	if res.Fixup != "vm-mismatch" || !strings.Contains(out, `"reason":"PostCloneVMMismatch"`) || strings.Contains(out, "patch") || strings.Contains(out, "db-0") {
		t.Fatalf("another pod's VM: %+v\n%s", res, out)
	}

	tight := options(t)
	tight.Limits.PlanMaxSteps = 1
	res, out, pods := one(t, tight, func(pod, vm []byte) ([]byte, []byte) { return pod, vm })
	if res.Fixup != "plan-failed" || !strings.Contains(out, `"reason":"PostClonePlanFailed"`) || !strings.HasPrefix(res.Errors[0], "no plan could be made: ") {
		t.Fatalf("a plan that cannot be made: %+v\n%s", res, out)
	}
	pod, _ := pods.Get("apps/web-0")
	var meta podMeta
	if err := json.Unmarshal(pod, &meta); err != nil {
		t.Fatal(err)
	}
	a := meta.Metadata.Annotations
	if a[cocoonfixup.KeyPostCloneState] != "failed" || a[cocoonfixup.KeyLifecycleState] != "failed" || a[cocoonfixup.KeyPostCloneHint] != "" {
		t.Fatalf("the plan-failed record: %v", a)
	}

	res, out, _ = one(t, options(t), annotate(`"vm.cocoonstack.io/post-clone-state": "done"`))
	if res.Action != "ip-wait-only" || out != "" {
		t.Fatalf("a fixup already done: %+v\n%s", res, out)
	}
	res, out, _ = one(t, options(t), annotate(`"vm.cocoonstack.io/lifecycle-state": "hibernating"`))
	if res.Action != "nothing stack-owns" || out != "" {
		t.Fatalf("a hibernating pod: %+v\n%s", res, out)
	}
}
