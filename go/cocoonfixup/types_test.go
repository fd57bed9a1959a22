package cocoonfixup

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

// A pod and a VM record given as structs plan as their JSON does: every
// bundled example, the plan and its binding verdict equal.
func TestTypedInputsPlanAsTheirJSON(t *testing.T) {
	for _, ex := range examples(t) {
		var pod struct {
			Metadata PodMeta `json:"metadata"`
		}
		var vm VMRecord
		if err := json.Unmarshal(ex.pod, &pod); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(ex.vm, &vm); err != nil {
			t.Fatal(err)
		}
		o := overrides(t, ex.args)
		fromJSON, errJSON := shared.Plan(ctx, ex.pod, ex.vm, o)
		typed, errTyped := shared.Plan(ctx, pod.Metadata, vm, o)
		if (errJSON == nil) != (errTyped == nil) {
			t.Fatalf("%s: %v vs %v", ex.name, errJSON, errTyped)
		}
		if errJSON != nil {
			continue
		}
		if !reflect.DeepEqual(fromJSON.Steps, typed.Steps) || fromJSON.Scenario != typed.Scenario ||
			!reflect.DeepEqual(fromJSON.Binding, typed.Binding) || fromJSON.NeedsFixup != typed.NeedsFixup {
			t.Errorf("%s: the typed inputs plan otherwise:\n%s\n%s", ex.name, fromJSON.JSON(), typed.JSON())
		}
	}
	if _, err := shared.Plan(ctx, nil, nil, Overrides{}); !errors.Is(err, ErrBadInput) {
		t.Errorf("no pod at all: %v", err)
	}
}
