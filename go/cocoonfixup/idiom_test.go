package cocoonfixup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// errNotFound stands for a caller's own sentinel, as its cocoon client
// returns it.
var errNotFound = errors.New("vm not found")

// failingVM's Inspect fails with err.
type failingVM struct{ err error }

func (v failingVM) Inspect(ctx context.Context, vm string, timeout time.Duration) ([]byte, error) {
	return nil, v.err
}

func (v failingVM) Exec(ctx context.Context, vm string, argv []string, timeout time.Duration) (ExecResult, error) {
	return ExecResult{}, errors.New("no exec expected")
}

// A stop on the caller's own error unwraps to it, and says when and how
// to run the pod again: the wait doubles with the tries the caller passes
// back, and the trigger is the stopped Run's (nothing was told yet). A VM
// the caller says is gone ends the step as gone, not to be tried again:
// the library decides so from the inspect's answer.
func TestCallerErrorsReachTheCaller(t *testing.T) {
	p := examplesPlanner(t, BackendProcess)
	defer p.Close()
	pod, vm := exampleFiles(t, "oci-static")
	failed := failingVM{fmt.Errorf("cocoon vm inspect: %w", errNotFound)}
	_, err := p.Run(context.Background(), pod, failed, stillPods{pod}, RunOptions{})
	var stop *StopError
	if !errors.As(err, &stop) || stop.Kind != "inspect" || !stop.Retryable {
		t.Fatalf("an inspect that failed: %v, want a retryable inspect stop", err)
	}
	if !errors.Is(err, errNotFound) || !errors.Is(err, ErrRetryable) {
		t.Errorf("the stop does not reach the caller's own error: %v", err)
	}
	if want := (Again{After: time.Second, Trigger: TriggerEvent, Tries: 1}); stop.Again == nil || *stop.Again != want {
		t.Errorf("the first stop's Again is %+v, want %+v", stop.Again, want)
	}
	// The fourth stop in a row of a startup: passed back, the tries
	// double the wait, and the startup is still to be announced.
	_, err = p.Run(context.Background(), pod, failed, stillPods{pod}, RunOptions{Trigger: TriggerStartup, Tries: 3})
	if want := (Again{After: 8 * time.Second, Trigger: TriggerStartup, Tries: 4}); !errors.As(err, &stop) || stop.Again == nil || *stop.Again != want {
		t.Errorf("the fourth stop: %v, Again %+v, want %+v", err, stop.Again, want)
	}
	// A refused `running` write comes after the startup was announced:
	// the next try is an event's, which does not announce it again (and
	// would still tell a node error).
	_, err = p.Run(context.Background(), pod, stillVM{vm}, refusingPods{stillPods{pod}}, RunOptions{Trigger: TriggerStartup})
	if want := (Again{After: time.Second, Trigger: TriggerEvent, Tries: 1}); !errors.As(err, &stop) || stop.Kind != "refused" || stop.Again == nil || *stop.Again != want {
		t.Errorf("a refused running write: %v, Again %+v, want %+v", err, stop.Again, want)
	}
	if _, err := p.Run(context.Background(), pod, failed, stillPods{pod}, RunOptions{Tries: -1}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("negative tries: %v, want ErrInvalidArgument", err)
	}
	gone := VMGone(fmt.Errorf("cocoon vm inspect: %w", errNotFound))
	_, err = p.Run(context.Background(), pod, failingVM{gone}, stillPods{pod}, RunOptions{})
	if !errors.As(err, &stop) || stop.Kind != StopVMGone || stop.Retryable || stop.Again != nil {
		t.Fatalf("a VM said gone: %v (Again %+v), want a %s stop that is not tried again", err, stop.Again, StopVMGone)
	}
	if errors.Is(err, ErrRetryable) || !errors.Is(err, errNotFound) {
		t.Errorf("a gone VM's stop: retryable %v, reaches the caller's error %v", errors.Is(err, ErrRetryable), errors.Is(err, errNotFound))
	}
}

// refusingPods refuses every write, as an admission denial does.
type refusingPods struct{ stillPods }

func (refusingPods) PatchAnnotations(ctx context.Context, namespace, name string, p PodPatch) ([]byte, error) {
	return nil, fmt.Errorf("%w: denied by the admission policy", ErrRefused)
}

// failingPods fails every write with a plain error naming no pod.
type failingPods struct{ stillPods }

func (failingPods) PatchAnnotations(ctx context.Context, namespace, name string, p PodPatch) ([]byte, error) {
	return nil, errors.New("the connection was reset")
}

// An API error of the caller's Pods names the pod in the stop's message.
func TestAnAPIErrorNamesThePod(t *testing.T) {
	p := examplesPlanner(t, BackendProcess)
	defer p.Close()
	pod, vm := exampleFiles(t, "oci-static")
	var meta struct {
		Metadata PodMeta `json:"metadata"`
	}
	if err := json.Unmarshal(pod, &meta); err != nil {
		t.Fatal(err)
	}
	_, err := p.Run(context.Background(), pod, stillVM{vm}, failingPods{stillPods{pod}}, RunOptions{})
	var stop *StopError
	if !errors.As(err, &stop) || stop.Kind != "api" {
		t.Fatalf("a write that failed: %v, want an api stop", err)
	}
	name := meta.Metadata.Namespace + "/" + meta.Metadata.Name
	if !strings.Contains(stop.Message, name) || !strings.Contains(stop.Message, "the connection was reset") {
		t.Errorf("the stop's message %q names neither the pod %s nor the error", stop.Message, name)
	}
}

// The zero Admission allows one pod at a time, and a step under it ends;
// the outcome names what it did with typed values.
func TestTheZeroAdmissionAllowsOne(t *testing.T) {
	p := examplesPlanner(t, BackendProcess)
	defer p.Close()
	pod, vm := exampleFiles(t, "oci-static")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// stillVM's exec leaves no step markers: every attempt fails, and the
	// short budget ends the loop.
	short := Settings{RetryBudget: 300 * time.Millisecond, RetryInterval: 10 * time.Millisecond}
	out, err := p.Run(ctx, pod, stillVM{vm}, stillPods{pod}, RunOptions{Admission: &Admission{}, Settings: short})
	if err != nil || out.Fixup != FixupExhausted {
		t.Fatalf("a Run under the zero Admission ended %+v %v", out, err)
	}
	if out.Action != HandledFixup || out.Scenario != ScenarioOCINetworkd {
		t.Errorf("the outcome says %q with scenario %q, want %q with %q", out.Action, out.Scenario, HandledFixup, ScenarioOCINetworkd)
	}
}

// Off switches off what can be; anything else negative, or Off where it
// means nothing, is refused naming the setting.
func TestSettingsSwitchedOff(t *testing.T) {
	doc, err := Settings{WakeGrace: Off, WakeEventWindow: Off, DHCPRecoveryAfter: Off, RenewAfter: Off, IPWait: time.Second}.document()
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]any{"wake_grace_ms": 0, "wake_event_window_ms": 0, "dhcp_recovery": false, "windows_renew": false, "ip_wait_ms": int64(1000)} {
		if doc[key] != want {
			t.Errorf("%s is %v (%T), want %v", key, doc[key], doc[key], want)
		}
	}
	if _, ok := doc["dhcp_recovery_after_ms"]; ok {
		t.Error("a DHCP recovery switched off still has its time")
	}
	for _, bad := range []struct {
		s    Settings
		what string
	}{{Settings{ExecTimeout: Off}, "exec_timeout cannot be switched off"}, {Settings{IPWait: -5 * time.Second}, "ip_wait is negative"}} {
		if _, err := bad.s.document(); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), bad.what) {
			t.Errorf("%+v: %v, want an invalid argument saying %q", bad.s, err, bad.what)
		}
	}
	// Refused by Run before anything is read.
	p := examplesPlanner(t, BackendProcess)
	defer p.Close()
	pod, vm := exampleFiles(t, "oci-static")
	if _, err := p.Run(context.Background(), pod, stillVM{vm}, stillPods{pod}, RunOptions{Settings: Settings{RetryBudget: Off}}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Run with RetryBudget Off: %v, want it refused", err)
	}
}

// An unknown Boot is refused, not taken for none.
func TestAnUnknownBootIsRefused(t *testing.T) {
	p := examplesPlanner(t, BackendProcess)
	defer p.Close()
	pod, vm := exampleFiles(t, "oci-static")
	_, err := p.Run(context.Background(), pod, stillVM{vm}, stillPods{pod}, RunOptions{Boot: "restore"})
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), `"restore"`) {
		t.Errorf("Boot \"restore\": %v, want it refused", err)
	}
}

// A Planner NewPlanner did not make is refused at once, never a hang or
// a panic.
func TestAnUnmadePlannerIsRefused(t *testing.T) {
	pod, vm := exampleFiles(t, "oci-static")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, p := range []*Planner{{}, nil} {
		if _, err := p.Run(ctx, pod, stillVM{vm}, stillPods{pod}, RunOptions{}); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("Run: %v", err)
		}
		if _, err := p.Plan(ctx, pod, vm, Overrides{}); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("Plan: %v", err)
		}
		if _, err := p.Observe(ctx, pod, &memoryRecords{}, ObserveOptions{}); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("Observe: %v", err)
		}
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
}

// failingOwner refuses every lifecycle change.
type failingOwner struct{ err error }

func (o failingOwner) Publish(ctx context.Context, pod PodRef, i LifecycleIntent) error {
	if pod.UID == "" || pod.ResourceVersion == "" {
		return fmt.Errorf("the change names no pod uid or version: %+v", pod)
	}
	return o.err
}

// A change the owner did not publish ends the Run with a retryable
// PublishError beside the Outcome, unwrapping to the owner's error.
func TestAnUnpublishedChangeIsTold(t *testing.T) {
	p := examplesPlanner(t, BackendProcess)
	defer p.Close()
	pod, vm := exampleFiles(t, "no-fixup")
	refused := errors.New("the intent table is full")
	out, err := p.Run(context.Background(), pod, stillVM{vm}, stillPods{pod}, RunOptions{Leases: leaseThen(func() {}), Lifecycle: failingOwner{refused}})
	var unpublished *PublishError
	if out == nil || out.Readiness != ReadinessReady || !errors.As(err, &unpublished) || !errors.Is(err, refused) || !errors.Is(err, ErrRetryable) {
		t.Fatalf("a change not published: %+v %v", out, err)
	}
	if !unpublished.Intent.Ready || unpublished.Intent.IP == "" {
		t.Errorf("the change not published: %+v", unpublished.Intent)
	}
}

// A StreamVM without its calls is refused before anything is read.
func TestAnIncompleteStreamVMIsRefused(t *testing.T) {
	p := examplesPlanner(t, BackendProcess)
	defer p.Close()
	pod, _ := exampleFiles(t, "oci-static")
	var none *StreamVM
	for _, vm := range []VM{StreamVM{}, StreamVM{Record: func(context.Context, string) (*VMRecord, error) { return nil, nil }}, none} {
		if _, err := p.Run(context.Background(), pod, vm, stillPods{pod}, RunOptions{}); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%#v: %v", vm, err)
		}
	}
}
