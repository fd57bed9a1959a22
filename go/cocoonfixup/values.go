package cocoonfixup

import (
	"context"
	"net"
	"time"
)

// Annotation keys and event reasons the fixup loop writes (spec sections
// 5-9).
const (
	KeyPostCloneState   = "vm.cocoonstack.io/post-clone-state"
	KeyPostCloneHint    = "vm.cocoonstack.io/post-clone-hint"
	KeyPostCloneErrors  = "vm.cocoonstack.io/post-clone-errors"
	KeyIP               = "vm.cocoonstack.io/ip"
	KeyLifecycleState   = "vm.cocoonstack.io/lifecycle-state"
	KeyLifecycleMessage = "vm.cocoonstack.io/lifecycle-state-message"
	// KeyLifecycleObservedGeneration is the generation the lifecycle
	// state was decided for.
	KeyLifecycleObservedGeneration = "vm.cocoonstack.io/lifecycle-observed-generation"
)

// Patch is a change to a pod's annotations: a value sets the key, nil
// removes it.
type Patch map[string]*string

// Event is a Kubernetes event to record on the pod.
type Event struct {
	Type    string `json:"type"` // Normal or Warning
	Reason  string `json:"reason"`
	Message string `json:"message"` // at most 512 bytes, cut on a UTF-8 boundary
	// Action is the event's action (events.k8s.io/v1 `action`), the
	// daemon's for the same reason: PostCloneFixup, BindVM, ReadyWait,
	// Resume, WindowsStaticIP.
	Action string `json:"action"`
}

// Record is what the loop writes at one point: the annotation patch (nil
// when nothing is to be written), the event, and for an exhausted fixup
// the final error chain.
type Record struct {
	Patch Patch  `json:"patch"`
	Event *Event `json:"event"`
	// Line is the error-chain line (AttemptFailed, PlanFailed).
	Line string `json:"line"`
	// Errors is the error chain as written (Exhausted): the attempts'
	// lines, and a last line when the hint had to be left out.
	Errors []string `json:"errors"`
	// HintLeftOut says why the hint was not written (Exhausted), or "".
	HintLeftOut *string `json:"hint_left_out"`
}

// values asks the library for one value; request carries its op.
func (p *Planner) values(ctx context.Context, request map[string]any, into any) error {
	return p.callInto(ctx, map[string]any{"op": "values", "request": request}, into)
}

func (p *Planner) value(ctx context.Context, request map[string]any) (string, error) {
	var v struct {
		Value string `json:"value"`
	}
	err := p.values(ctx, request, &v)
	return v.Value, err
}

func annotationsOrEmpty(a map[string]string) map[string]string {
	if a == nil {
		return map[string]string{}
	}
	return a
}

// ErrorsAnnotation is the post-clone-errors value for an error chain: at
// most 4096 bytes, cut on a UTF-8 boundary keeping the newest lines, the
// cut announced.
func (p *Planner) ErrorsAnnotation(ctx context.Context, errors []string) (string, error) {
	if errors == nil {
		errors = []string{}
	}
	return p.value(ctx, map[string]any{"op": "errors-annotation", "errors": errors})
}

// OneLine makes text one line for the error chain: newlines become " | ",
// other control characters are escaped.
func (p *Planner) OneLine(ctx context.Context, text string) (string, error) {
	return p.value(ctx, map[string]any{"op": "one-line", "text": text})
}

// EventMessage cuts a message to the 512 bytes of an event, on a UTF-8
// boundary, saying so.
func (p *Planner) EventMessage(ctx context.Context, message string) (string, error) {
	return p.value(ctx, map[string]any{"op": "event-message", "message": message})
}

// AttemptFailed is the error-chain line and the PostCloneExecAttemptFailed
// event of a failed attempt (attempts count from 1; err is the Verdict's
// Error, or the exec's own error as one line).
func (p *Planner) AttemptFailed(ctx context.Context, attempt int, err string) (*Record, error) {
	var r Record
	return &r, p.values(ctx, map[string]any{"op": "attempt-failed", "attempt": attempt, "error": err}, &r)
}

// Succeeded is the post-clone-state=done patch and the PostCloneSucceeded
// event.
func (p *Planner) Succeeded(ctx context.Context, scenario string, attempts int) (*Record, error) {
	var r Record
	return &r, p.values(ctx, map[string]any{"op": "succeeded", "scenario": scenario, "attempts": attempts}, &r)
}

// Exhausted is the failure record of a fixup whose budget ran out:
// post-clone-state=failed, the hint (left out, and said so, when the pod's
// annotations could not hold it), the error chain, lifecycle Failed when
// stickiness allows, with the chain as its message; and the
// PostCloneExecExhausted event, "<operation>: <chain>". annotations are the
// pod's as read just before the write; operation is upstream's op:
// "create" for a first fixup, "update" for one a pod update started,
// "reconcile" for work resumed.
func (p *Planner) Exhausted(ctx context.Context, annotations map[string]string, r *Report, operation string, errors []string) (*Record, error) {
	if errors == nil {
		errors = []string{}
	}
	var out Record
	return &out, p.values(ctx, map[string]any{
		"op": "exhausted", "annotations": annotationsOrEmpty(annotations), "scenario": r.Scenario,
		"hint": r.HintValue(), "operation": operation, "errors": errors,
	}, &out)
}

// PlanFailed is the record of a pod for which no plan could be made
// (Plan's error, when Error.PlanFailed): post-clone-state=failed, the
// error chain of one line, lifecycle Failed; no hint. And its
// PostClonePlanFailed event.
func (p *Planner) PlanFailed(ctx context.Context, annotations map[string]string, planErr error) (*Record, error) {
	message := planErr.Error()
	if e, ok := errorsOf(planErr); ok {
		message = e.Message
	}
	var out Record
	return &out, p.values(ctx, map[string]any{"op": "plan-failed", "annotations": annotationsOrEmpty(annotations), "error": message}, &out)
}

// VMMismatch is the PostCloneVMMismatch event for a pod whose VM record
// (vm, as cocoon printed it) is not its own, or nil when it is. The event
// never names the other VM.
func (p *Planner) VMMismatch(ctx context.Context, pod, vm []byte, acceptLegacyVMNames bool) (*Event, error) {
	var out struct {
		Event *Event `json:"event"`
	}
	err := p.values(ctx, map[string]any{"op": "vm-mismatch", "pod_json": string(pod), "vm_json": string(vm), "accept_legacy_vm_names": acceptLegacyVMNames}, &out)
	return out.Event, err
}

// StillOurs reports whether the pod, as read again just now, is still the
// one the loop works for: the same uid, the decision table still open (not
// hibernating, not deleting, the lifecycle not moved on, not parked), and
// no other VM id annotated than vmID. The daemon asks before the running
// write, before each attempt, and before every final write; when it says
// no, nothing more is written.
func (p *Planner) StillOurs(ctx context.Context, pod []byte, uid, vmID string) (bool, error) {
	var out struct {
		Value bool `json:"value"`
	}
	err := p.values(ctx, map[string]any{"op": "still-ours", "pod_json": string(pod), "uid": uid, "vm_id": vmID}, &out)
	return out.Value, err
}

// Resumed is the ResumedAfterRestart event for work picked up again after
// a restart (the Decision's Op).
func (p *Planner) Resumed(ctx context.Context, op string) (*Event, error) {
	var out Record
	err := p.values(ctx, map[string]any{"op": "resumed", "work": op}, &out)
	return out.Event, err
}

// IPWaitTimeout is the record of an IP wait that ran out: lifecycle Failed
// (Patch nil when stickiness forbids it) and the PostCloneIPWaitTimeout
// event.
func (p *Planner) IPWaitTimeout(ctx context.Context, annotations map[string]string, vmName string, budget time.Duration) (*Record, error) {
	var out Record
	return &out, p.values(ctx, map[string]any{"op": "ip-wait-timeout", "annotations": annotationsOrEmpty(annotations), "vm_name": vmName, "budget_ms": budget.Milliseconds()}, &out)
}

// Ready is the patch that publishes the IP and moves the lifecycle to
// ready (when stickiness allows). Write it only when StillOurs says so.
func (p *Planner) Ready(ctx context.Context, annotations map[string]string, ip net.IP) (Patch, error) {
	v4 := ip.To4()
	if v4 == nil {
		return nil, &Error{Code: CodeInvalidArgument, Message: "the IP must be IPv4, got " + ip.String()}
	}
	var out Record
	err := p.values(ctx, map[string]any{"op": "ready", "annotations": annotationsOrEmpty(annotations), "ip": v4.String()}, &out)
	return out.Patch, err
}

// StatePatch sets post-clone-state: "running" before the first attempt,
// "done" or "failed" after.
func (p *Planner) StatePatch(ctx context.Context, state string) (Patch, error) {
	var out Record
	err := p.values(ctx, map[string]any{"op": "state", "state": state}, &out)
	return out.Patch, err
}
