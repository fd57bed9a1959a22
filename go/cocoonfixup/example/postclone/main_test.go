package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var examples = filepath.Join("..", "..", "..", "..", "examples")

func byPod(outcomes []Outcome) map[string]Outcome {
	m := map[string]Outcome{}
	for _, o := range outcomes {
		m[o.Pod] = o
	}
	return m
}

// The example's loop over the bundled examples: a guest that fails once
// is repaired on the second attempt; one that always fails exhausts the
// budget with the error chain and the exhausted record.
func TestExampleLoop(t *testing.T) {
	var out bytes.Buffer
	quick := Budget{Interval: 20 * time.Millisecond, Total: 2 * time.Second, ExecTimeout: time.Second}
	outcomes, err := Run(examples, 1, quick, &out)
	if err != nil {
		t.Fatal(err)
	}
	got := byPod(outcomes)
	web := got["apps/web-0"]
	if web.Action != "run-loop" || web.Fixup != "done" || web.Attempts != 2 || len(web.Errors) != 1 ||
		!strings.HasPrefix(web.Errors[0], "attempt 1: step 2/") || !strings.Contains(web.Errors[0], "unit is masked") {
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
	outcomes, err = Run(examples, 1000, short, &out)
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
