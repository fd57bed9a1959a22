package cocoonfixup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// VM reaches the pod's VM: the caller's own cocoon client.
type VM interface {
	// Inspect returns what `cocoon vm inspect --json <vm>` prints, within
	// timeout. vm is a VM id or name.
	Inspect(ctx context.Context, vm string, timeout time.Duration) ([]byte, error)
	// Exec runs argv in the VM, `cocoon vm exec <vm> -- argv...`, and
	// gives up after timeout (an error). Keep at least the last 64 KiB of
	// stderr and say whether earlier bytes were cut. Start `cocoon` in a
	// process group of its own (SysProcAttr.Setpgid) and kill the group
	// when ctx ends, so that a terminal's Ctrl-C reaches the program
	// alone and no grandchild outlives the call; run the service with
	// systemd's KillMode=mixed, so that a stop signals the program, which
	// cancels ctx, rather than every `cocoon` it runs. An exec ended by
	// SIGHUP, SIGINT or SIGTERM waits a second for ctx to end before its
	// attempt counts as failed.
	Exec(ctx context.Context, vm string, argv []string, timeout time.Duration) (ExecResult, error)
}

// Pods reads and writes the pod: the caller's own Kubernetes client. Its
// errors say what kind of failure they are by wrapping ErrGone (the pod
// is not found, or its uid precondition failed), ErrRefused (401, 422,
// an admission denial's 403) or ErrConflict (PatchAnnotations only: the
// resourceVersion precondition failed); anything else is an API error,
// retried, the authorizer's 403 among them (an API server that has just
// started answers so until it has loaded its bindings; the daemon and
// kubeclient treat it so).
type Pods interface {
	// Get reads the pod as the API server returns it (JSON); nil and no
	// error when it is not found.
	Get(ctx context.Context, namespace, name string) ([]byte, error)
	// PatchAnnotations merge-patches the pod's annotations (a nil value
	// removes the key) with metadata.uid, and metadata.resourceVersion
	// when not empty, as preconditions, and returns the pod the API server
	// answered with (nil is fine). On ErrConflict, return the pod as it is
	// now with the error (nil: Run reads it).
	PatchAnnotations(ctx context.Context, namespace, name string, p PodPatch) ([]byte, error)
	// Event records an event on the pod (best effort: an error is logged),
	// with the caller's own reportingController (any name: of the events
	// the step reads back, only the stack's Woken and
	// HibernateSnapshotExists count).
	Event(ctx context.Context, namespace, name, uid string, e Event) error
}

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

// PodPatch is one annotation write with its preconditions.
type PodPatch struct {
	// Annotations is never nil (encode it as an object: a merge patch of
	// `annotations: null` would remove every annotation).
	Annotations     Patch
	UID             string
	ResourceVersion string // "" for the uid precondition only
}

// NodePodLister is what Pods also implements when it can list every pod
// on its node (Options.AcceptAnnotatedVMNames needs it): the pods as the
// API server returns them, the asking pod among them.
type NodePodLister interface {
	NodePods(ctx context.Context) ([][]byte, error)
}

// EventLister is what Pods also implements when it can list events
// (events.k8s.io/v1) in a namespace by a field selector: the events as the
// API server returns them. The package asks only for the stack's Woken and
// HibernateSnapshotExists about the pod, one selector each per accepted
// reporter (regarding.uid, reason, type and reportingController), so no
// other event can fill what is read; they then tell a hibernate wake. The
// selector is passed to the API server as it is. A lister that reads a
// bounded number of events returns those it read with an error wrapping
// ErrEventsTruncated when more matched: the package then knows that the
// stack's own event may be among those not read.
type EventLister interface {
	ListEvents(ctx context.Context, namespace, fieldSelector string) ([][]byte, error)
}

// ErrEventsTruncated is what an EventLister's ListEvents wraps, beside the
// events it read, when more events matched the selector than it reads
// (only a forger makes that many).
var ErrEventsTruncated = errors.New("more events matched the selector than were read")

// Leases tells the VM's DHCP lease: the address leased to mac now, or ""
// for none yet. An error says the lease file cannot tell (unreadable, or
// not a list of leases).
type Leases interface {
	Lease(ctx context.Context, mac string) (string, error)
}

// LeaseWaiter is what Leases also implements when it can wait for a
// lease itself (a file watch) rather than be polled.
type LeaseWaiter interface {
	WaitLease(ctx context.Context, mac string, until time.Time) (string, error)
}

// Clock is Run's time: the real one by default.
type Clock interface {
	Now() time.Time
	// SleepUntil returns at t, or with ctx's error when ctx ends first.
	SleepUntil(ctx context.Context, t time.Time) error
}

// Records keeps the library's record of a pod by uid (its retry budget,
// the wake verdict for its VM, which VM its post-clone-state was written
// for), so that neither a retry nor a restart of the caller gives a pod a
// fresh budget. Drop a record when its pod is gone (keep every other,
// even one that looks empty: it notes the watch). Run keeps a step's
// record by merging it into the stored one through the library (what
// Observe noted meanwhile stays), so a Run whose Planner is closed before
// it keeps its record keeps none: the next step's budget is then the one
// stored before.
type Records interface {
	// Load returns the record Store kept for uid, or nil.
	Load(ctx context.Context, uid string) (json.RawMessage, error)
	Store(ctx context.Context, uid string, record json.RawMessage) error
}

// Trigger says why Run handles the pod.
type Trigger string

const (
	TriggerEvent   Trigger = "event"   // a pod event (the default)
	TriggerStartup Trigger = "startup" // the caller's start: resumed work is announced (ResumedAfterRestart)
	TriggerRetry   Trigger = "retry"   // a retry after a stop the pod was told of: it is not told again
	// TriggerPrepare is no fixup: the pod's running VM is prepared to be
	// cloned (Planner.Prepare).
	TriggerPrepare Trigger = "prepare"
)

// Off switches a Settings duration off where that means something: no
// wake grace (a pod with the host's hibernate history and no witness of
// the stack is then a recreate at once), no DHCP recovery pass, no
// Windows renew nudge, and a wake event window of none (only events at or
// after the VM's creation count). Elsewhere it is refused.
const Off time.Duration = -1

// Settings are the step's numbers; zero fields take the daemon's
// defaults, and Off switches WakeGrace, WakeEventWindow,
// DHCPRecoveryAfter and RenewAfter off.
type Settings struct {
	RetryInterval     time.Duration // between fixup attempts (3s)
	RetryBudget       time.Duration // attempts stop this long after the first (180s)
	ExecTimeout       time.Duration // one exec (90s)
	InspectTimeout    time.Duration // one inspect
	IPWait            time.Duration // the IP wait (45s)
	RenewAfter        time.Duration // the Windows renew nudge
	RenewTimeout      time.Duration
	DHCPRecoveryAfter time.Duration // the DHCP recovery pass of a Linux clone
	WakeEventWindow   time.Duration // stack events this close to the VM's creation count
	WakeGrace         time.Duration // a CH Windows pod with no evidence of a wake waits this long
	SACDeadline       time.Duration // the whole serial-console pass, every NIC included (120s)
	PollLeasesEvery   time.Duration // Leases without LeaseWaiter are polled this often (200ms)
	// WakeEventReporters are the stack's event sources: only their Woken
	// and HibernateSnapshotExists events count as evidence of a wake
	// (nil: vk-cocoon).
	WakeEventReporters []string
}

func (s Settings) document() (map[string]any, error) {
	doc := map[string]any{}
	var bad []string
	set := func(key string, d time.Duration) {
		switch {
		case d > 0:
			doc[key] = d.Milliseconds()
		case d == Off:
			switch key {
			case "wake_grace_ms", "wake_event_window_ms":
				doc[key] = 0
			case "dhcp_recovery_after_ms":
				doc["dhcp_recovery"] = false
			case "renew_after_ms":
				doc["windows_renew"] = false
			default:
				bad = append(bad, strings.TrimSuffix(key, "_ms")+" cannot be switched off")
			}
		case d < 0:
			bad = append(bad, fmt.Sprintf("%s is negative (%v)", strings.TrimSuffix(key, "_ms"), d))
		}
	}
	set("retry_interval_ms", s.RetryInterval)
	set("retry_budget_ms", s.RetryBudget)
	set("exec_timeout_ms", s.ExecTimeout)
	set("inspect_timeout_ms", s.InspectTimeout)
	set("ip_wait_ms", s.IPWait)
	set("renew_after_ms", s.RenewAfter)
	set("renew_timeout_ms", s.RenewTimeout)
	set("dhcp_recovery_after_ms", s.DHCPRecoveryAfter)
	set("wake_event_window_ms", s.WakeEventWindow)
	set("wake_grace_ms", s.WakeGrace)
	set("sac_deadline_ms", s.SACDeadline)
	if len(s.WakeEventReporters) > 0 {
		doc["wake_event_reporters"] = s.WakeEventReporters
	}
	if len(bad) > 0 {
		return nil, invalid("Settings: %s", strings.Join(bad, "; "))
	}
	return doc, nil
}

// oldEventLister is the event listing of earlier versions of this
// package, which no longer is called: a Pods that still has only it is
// told so, once per Run, rather than quietly reading no events.
type oldEventLister interface {
	PodEvents(ctx context.Context, namespace, uid string) ([][]byte, error)
}

// RunOptions are Run's optional parts.
type RunOptions struct {
	Trigger Trigger
	// Tries is how many times in a row the pod's Runs stopped before this
	// one: the last StopError's Again.Tries (0 for a first try). The
	// library doubles the wait after the next stop with it.
	Tries    int
	Settings Settings
	// Leases tells DHCP leases for the IP wait. Nil: the planner's
	// (Planner.LeaseFile: cocoon-net's lease file, polled).
	Leases Leases
	Clock  Clock
	// Records keeps the pods' records; nil keeps none (each fixup loop's
	// budget then starts with its Run).
	Records Records
	// WatchedSinceNew: the caller has watched the pod without a gap since
	// it first saw it with no lifecycle annotation, so a CH Windows pod
	// with no evidence of a wake is not held for the wake grace. Pass
	// what Observe last answered for the pod over the same Records: it
	// is safe only where a hibernation the watch saw is in the record.
	// It is ignored without Records and without a usable stored record.
	WatchedSinceNew bool
	// Log receives the step's log lines ("info", "warn", "error"), each
	// naming the pod.
	Log func(level, message string)
	// Admission bounds the pods worked on at once (shared by the Runs
	// of a provider); nil: no bound. A step waiting for the IP holds no
	// turn.
	Admission *Admission
	// Lifecycle, when set, owns the lifecycle keys (KeyLifecycleState,
	// its message, the observed generation, KeyIP): Run writes none of
	// them and hands each change to it instead, in the order the writes
	// would have been made, right after the write it goes with landed,
	// and waits for it. Nil: Run writes them itself. The step still
	// reads lifecycle-state and lifecycle-observed-generation back from
	// the pod (failed sticks within a generation; a pod the stack owns is
	// left alone), so the owner writes exactly what each intent says.
	Lifecycle LifecycleOwner
	// Boot is how the caller booted the VM, when it knows: evidence of a
	// wake, or of none, that needs neither the stack's events nor the
	// wake grace. BootUnknown (""): the step finds out.
	Boot Boot
	// SourceImage is the snapshot's source image, when the caller knows
	// it: it replaces the record's config.image (an http(s) URL is a
	// cloudimg guest).
	SourceImage string

	// For the package's own replay of the conformance suite: the serial
	// console and the settings as the scenario gives them.
	console     consoleOps
	settingsDoc map[string]any
}

// consoleOps carries out the serial-console actions: the library's
// console (below the planner's cocoon root) unless replaced.
type consoleOps interface {
	open(ctx context.Context, action json.RawMessage) map[string]any
	set(ctx context.Context, action json.RawMessage) map[string]any
	close()
}

// Admission is a bound on the pods worked on at once, shared by Runs.
// Its zero value allows one pod at a time.
type Admission struct {
	once  sync.Once
	turns chan struct{}
}

// NewAdmission allows n pods worked on at once (at least 1).
func NewAdmission(n int) *Admission {
	if n < 1 {
		n = 1
	}
	return &Admission{turns: make(chan struct{}, n)}
}

func (a *Admission) acquire(ctx context.Context) bool {
	a.once.Do(func() {
		if a.turns == nil {
			a.turns = make(chan struct{}, 1)
		}
	})
	select {
	case a.turns <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

func (a *Admission) release() { <-a.turns }

// Outcome is how the step ended: the summary `cocoon-fixup run` prints.
type Outcome struct {
	Pod    string  `json:"pod"`
	Action Handled `json:"action"`
	// Scenario is the network scenario of the fixup (Action "fixup"), or
	// "".
	Scenario Scenario `json:"scenario"`
	// Fixup is how the fixup loop ended, or "".
	Fixup    FixupEnd `json:"fixup"`
	Attempts int      `json:"attempts"`
	// Readiness is how the IP wait ended, or "".
	Readiness Readiness `json:"readiness"`
	IP        string    `json:"ip"`
	// SAC is how the serial-console pass ended, or "".
	SAC SACEnd `json:"sac"`
	// HandsOff is why the pod was left alone (Action "nothing"), or "".
	HandsOff HandsOff `json:"hands_off"`
	// Prepared is what a preparation wrote to vm.cocoonstack.io/prepared
	// (the plugin, its version and digest), or "".
	Prepared string `json:"prepared"`
	// Errors is the error chain of a failed fixup or preparation (of a
	// preparation with nothing to do: why).
	Errors []string `json:"errors"`
	// Summary is the whole summary as the library gave it.
	Summary json.RawMessage `json:"-"`
}

// StopError is a step that stopped before it could decide: nothing was
// written. Retryable: trying the pod again later can succeed, and Again
// says when and how.
type StopError struct {
	Kind      string
	Retryable bool
	Message   string
	// Again is the library's word on when and how to run the pod again;
	// nil when trying again cannot help (the stop is not Retryable).
	Again *Again
	// Err is the caller's own error the step stopped on (its VM's or its
	// Pods'), or nil: errors.Is and errors.As reach it through Unwrap.
	Err error
}

// Again is when and how to run a stopped pod again, as the library
// decides it for the daemon and every embedder alike: wait After, then
// Run the pod again with RunOptions{Trigger: Trigger, Tries: Tries}. The
// caller only keeps the timer.
//
// After doubles with each stop in a row, up to a cap (the backoff of
// docs/behaviour.md section 8, Backoff in core/src/decision/stop.rs).
// Trigger says what the next Run still has to tell: TriggerRetry after a node error (told
// once); TriggerEvent after a startup that stopped past its announcement
// of resumed work (a failed or refused write), so it is not announced
// again; else the stopped Run's own, so a startup whose inspect failed
// still announces ResumedAfterRestart when it is tried again.
// Tries counts the stops in a row, this one included.
type Again struct {
	After   time.Duration
	Trigger Trigger
	Tries   int
}

func (e *StopError) Error() string {
	return fmt.Sprintf("cocoonfixup: the post-clone step stopped (%s): %s", e.Kind, e.Message)
}

// Unwrap is the caller's own error the step stopped on.
func (e *StopError) Unwrap() error { return e.Err }

// StopVMGone is the Kind of a step that stopped because the caller's VM
// said the VM is gone (its Inspect error wraps ErrVMGone): not retryable;
// the pod's next VM is a new step.
const StopVMGone = "vm-gone"

// StopMissingFact is the Kind of a step that stopped because it needs a
// fact of the VM record the caller's record lacks (a RecordInspector's
// empty Config.Image or CreatedAt) and nothing else gives it: not
// retryable; give the fact, RunOptions.SourceImage or RunOptions.Boot.
const StopMissingFact = "missing-fact"

// ErrVMGone is what a VM's Inspect error wraps (or matches with an Is
// method) when the VM does not exist: Run tells the library so, and the
// step stops as StopVMGone, not to be tried again. VMGone marks the
// caller's own error so.
var ErrVMGone = errors.New("cocoonfixup: the VM is gone")

// VMGone is err marked as a VM that does not exist: errors.Is matches
// ErrVMGone, and Unwrap gives err back (so the caller's own sentinel,
// such as its runtime's "VM not found", still matches too).
func VMGone(err error) error { return vmGone{err} }

type vmGone struct{ err error }

func (g vmGone) Error() string {
	if g.err == nil {
		return ErrVMGone.Error()
	}
	return g.err.Error()
}

func (g vmGone) Is(target error) bool { return target == ErrVMGone }

func (g vmGone) Unwrap() error { return g.err }

// Is matches ErrRetryable for a retryable stop.
func (e *StopError) Is(target error) bool {
	return target == ErrRetryable && e.Retryable
}

// What Pods' errors wrap to say what kind of failure they are.
var (
	ErrGone     = errors.New("cocoonfixup: the pod is gone")
	ErrRefused  = errors.New("cocoonfixup: the API server refused the request")
	ErrConflict = errors.New("cocoonfixup: the pod changed (resourceVersion precondition)")
)

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) SleepUntil(ctx context.Context, t time.Time) error {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Prepare prepares pod's running VM to be cloned, before the stack
// snapshots it as a parent (call it before the CocoonSet's snapshot): the
// plugin that plans the clones' network scenario plans `prepare`, and it
// runs in the guest as a fixup does (the VM bound to the pod, the same exec
// path, markers and retry budget). When it took, the pod gets
// vm.cocoonstack.io/prepared (Outcome.Prepared); copy it onto the clones
// made from the snapshot. Outcome.Fixup says how it ended (done,
// exhausted, plan-failed, shutdown, gone). HandsOff says why a pod was
// left alone (deleting, hibernate-requested, not-settled, macos,
// not-managed): with Action "nothing" when it was so from the start, with
// Action "prepare" and Fixup "gone" when it became so between attempts.
// Action is "nothing" with Errors[0] saying why for a guest with nothing
// to prepare (a Windows guest, a plugin without `prepare`). Running it
// again is harmless. o.Records, o.Leases and o.WatchedSinceNew do not
// apply.
func (p *Planner) Prepare(ctx context.Context, pod any, vm VM, pods Pods, o RunOptions) (*Outcome, error) {
	o.Trigger = TriggerPrepare
	o.Records = nil
	return p.Run(ctx, pod, vm, pods, o)
}

// Run carries out the post-clone step for pod (as the API server returns
// it: its JSON, a PodMeta, or any value that encodes to it such as a
// *corev1.Pod) the way the node daemon does: the library decides every step,
// Run only carries each one out through vm and pods. Cancelling ctx is a
// shutdown: the action under way is abandoned, nothing is marked failed,
// and work left `running` resumes at the next Run (with TriggerStartup
// after a restart). The error is a *StopError when the step stopped
// before it could decide (a retryable one is errors.Is ErrRetryable): when
// its Again is not nil, wait Again.After and Run the pod again with
// RunOptions{Trigger: Again.Trigger, Tries: Again.Tries}. It is an *Error
// when the library refused the input or could not be reached.
func (p *Planner) Run(ctx context.Context, pod any, vm VM, pods Pods, o RunOptions) (*Outcome, error) {
	if err := p.unmade(); err != nil {
		return nil, err
	}
	if vm == nil || pods == nil {
		return nil, invalid("Run needs a VM and Pods")
	}
	if err := usableVM(vm); err != nil {
		return nil, err
	}
	doc, err := document(pod)
	if err != nil {
		return nil, err
	}
	r := &runner{p: p, vm: vm, pods: pods, o: o, clock: o.Clock, console: o.console, caller: ctx}
	if r.clock == nil {
		r.clock = realClock{}
	}
	r.start = r.clock.Now()
	trigger := o.Trigger
	if trigger == "" {
		trigger = TriggerEvent
	}
	settings, err := o.Settings.document()
	if err != nil {
		return nil, err
	}
	if o.settingsDoc != nil {
		settings = o.settingsDoc
	}
	if o.Lifecycle != nil {
		settings["lifecycle_intents"] = true
	}
	knows, err := o.knows()
	if err != nil {
		return nil, err
	}
	// The wall clock: a wake event of the stack dated after it is no
	// evidence.
	options := map[string]any{"trigger": string(trigger), "settings": settings, "now_unix_ms": r.clock.Now().UnixMilli()}
	switch {
	case o.Tries < 0:
		return nil, invalid("RunOptions.Tries is negative (%d): pass the last stop's Again.Tries, or 0", o.Tries)
	case o.Tries > 0:
		options["tries"] = o.Tries
	}
	if len(knows) > 0 {
		options["knows"] = knows
	}
	var meta podMeta
	if err := json.Unmarshal(doc, &struct {
		Metadata *podMeta `json:"metadata"`
	}{&meta}); err != nil {
		return nil, &Error{Code: CodeBadInput, Message: "the pod is not JSON as the API server returns it: " + err.Error()}
	}
	r.meta = meta
	if o.Records != nil && meta.UID != "" {
		// Read to its end whatever ctx says: the record is the budget.
		lctx, done := uncancelled(ctx)
		record, err := o.Records.Load(lctx, meta.UID)
		done()
		if err != nil {
			// Without the record the step keeps none this time: what it
			// would keep could replace the budget the record holds.
			r.log("warn", "the pod's record cannot be read, so this step keeps none: "+err.Error())
		} else {
			memory := map[string]any{"now_unix_ms": r.clock.Now().UnixMilli()}
			switch {
			case len(record) == 0 || string(record) == "null":
			case !json.Valid(record):
				// Nothing can be read from it: the step starts a new
				// record, which replaces it when kept.
				r.log("warn", "the pod's stored record is not JSON: this step starts a new one, which replaces it")
			default:
				// Watched since new is known only beside the record
				// that noted the watch: without one it is a gap.
				memory["record"] = record
				memory["watched_since_new"] = o.WatchedSinceNew
			}
			options["memory"] = memory
		}
	}
	var started struct {
		Task   uint64          `json:"task"`
		Action json.RawMessage `json:"action"`
	}
	if !p.enter() {
		return nil, ErrClosed
	}
	defer p.runs.Done()
	// Close is a shutdown for the Runs in flight.
	ctx, cancel := p.untilClose(ctx)
	defer cancel()
	// The task, and the console it opens, live in this session: a child
	// that dies under them ends the Run with ErrUnavailable, and the next
	// Run starts a new one.
	c, err := p.session(ctx)
	if err != nil {
		return nil, err
	}
	r.c = c
	if r.console == nil {
		r.console = &libraryConsole{p: p, c: c, task: &r.task}
	}
	// Not abandoned on cancel: a task started must be freed. A cancel is
	// the task's to hear, at its first action.
	if err := p.callOnInto(context.Background(), c, map[string]any{"op": "task_start", "planner": c.handle, "pod": string(doc), "options": options}, &started); err != nil {
		return nil, err
	}
	r.task = started.Task
	defer func() {
		if r.admitted {
			o.Admission.release()
		}
		r.console.close()
		// Freed whatever ctx says.
		p.callOn(context.Background(), c, map[string]any{"op": "task_free", "task": r.task})
	}()
	return r.loop(ctx, started.Action)
}

type podMeta struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	UID       string `json:"uid"`
}

type runner struct {
	p        *Planner
	c        *conn // the session the task lives in
	vm       VM
	pods     Pods
	o        RunOptions
	clock    Clock
	start    time.Time
	meta     podMeta
	task     uint64
	console  consoleOps
	admitted bool
	// caller is the context Run was given: its cancel is the caller's.
	caller context.Context
	// lastErr is the caller's own error the last callback returned, which
	// a stop unwraps to.
	lastErr error
	// lacks are the facts the caller's typed record left empty.
	lacks []string
	// unpublished is the first lifecycle change the owner failed to
	// publish.
	unpublished *PublishError
}

// PublishError is a lifecycle change RunOptions.Lifecycle did not
// publish: Run returns it beside the Outcome. Retryable: a later Run of
// the pod hands a lost change over again.
type PublishError struct {
	Intent LifecycleIntent
	Err    error
}

func (e *PublishError) Error() string {
	return fmt.Sprintf("cocoonfixup: the lifecycle change (%s) was not published: %v", e.Intent, e.Err)
}

// Unwrap is the owner's own error.
func (e *PublishError) Unwrap() error { return e.Err }

// Is matches ErrRetryable.
func (e *PublishError) Is(target error) bool { return target == ErrRetryable }

// log hands a line to RunOptions.Log, naming the pod.
func (r *runner) log(level, message string) {
	if r.o.Log != nil {
		r.o.Log(level, "pod "+r.meta.Namespace+"/"+r.meta.Name+": "+message)
	}
}

func (r *runner) at(ms int64) time.Time { return r.start.Add(time.Duration(ms) * time.Millisecond) }

// action is one action of the task, every field any action has.
type action struct {
	Action             string          `json:"action"`
	VM                 string          `json:"vm"`
	TimeoutMS          int64           `json:"timeout_ms"`
	VMName             string          `json:"vm_name"`
	Namespace          string          `json:"namespace"`
	UID                string          `json:"uid"`
	FieldSelectors     []string        `json:"field_selectors"`
	Annotations        Patch           `json:"annotations"`
	ResourceVersion    *string         `json:"resource_version"`
	Argv               []string        `json:"argv"`
	Purpose            string          `json:"purpose"`
	MAC                string          `json:"mac"`
	UntilMS            int64           `json:"until_ms"`
	Type               string          `json:"type"`
	Reason             string          `json:"reason"`
	Message            *string         `json:"message"`
	EventAction        string          `json:"event_action"`
	Level              string          `json:"level"`
	Record             json.RawMessage `json:"record"`
	Summary            json.RawMessage `json:"summary"`
	State              *string         `json:"state"`
	ObservedGeneration *string         `json:"observed_generation"`
	IP                 *string         `json:"ip"`
	Ready              bool            `json:"ready"`
	Stop               *struct {
		Kind      string `json:"kind"`
		Retryable bool   `json:"retryable"`
		Message   string `json:"message"`
		Again     *struct {
			AfterMS int64  `json:"after_ms"`
			Trigger string `json:"trigger"`
			Tries   int    `json:"tries"`
		} `json:"again"`
	} `json:"stop"`
}

// interruptible actions are answered `cancelled` once ctx has ended.
var interruptible = map[string]bool{
	"admit": true, "checkpoint": true, "exec": true, "wait_lease": true,
	"sleep": true, "sac_open": true, "sac_set": true,
}

func (r *runner) loop(ctx context.Context, first json.RawMessage) (*Outcome, error) {
	raw := first
	for {
		var a action
		if err := json.Unmarshal(raw, &a); err != nil {
			return nil, invalid("reading the task's action: %v", err)
		}
		if a.Action == "finish" {
			return r.finish(a)
		}
		var report map[string]any
		if interruptible[a.Action] && ctx.Err() != nil {
			report = map[string]any{"cancelled": true}
		} else {
			report = r.carryOut(ctx, a, raw)
		}
		report["now_ms"] = r.clock.Now().Sub(r.start).Milliseconds()
		// The task's own calls are not abandoned on cancel: they are
		// short, and the task must hear how its action ended.
		next, err := r.p.callOn(context.Background(), r.c, map[string]any{"op": "task_next", "task": r.task, "report": report})
		if err != nil {
			return nil, err
		}
		raw = next
	}
}

func (r *runner) finish(a action) (*Outcome, error) {
	if a.Stop != nil {
		stop := &StopError{Kind: a.Stop.Kind, Retryable: a.Stop.Retryable, Message: a.Stop.Message, Err: r.lastErr}
		if again := a.Stop.Again; again != nil {
			stop.Again = &Again{After: millis(again.AfterMS), Trigger: Trigger(again.Trigger), Tries: again.Tries}
		}
		return nil, stop
	}
	var out Outcome
	if err := json.Unmarshal(a.Summary, &out); err != nil {
		return nil, invalid("reading the summary: %v", err)
	}
	out.Summary = append(json.RawMessage(nil), a.Summary...)
	// A step the caller's cancel cut short ends with the cancel's own
	// error; Close's is a shutdown without one.
	if err := r.caller.Err(); err != nil && out.interrupted() {
		return &out, err
	}
	if r.unpublished != nil {
		return &out, r.unpublished
	}
	return &out, nil
}

// interrupted says a shutdown cut the step short somewhere.
func (o *Outcome) interrupted() bool {
	return o.Action == HandledShutdown || o.Fixup == FixupShutdown || o.Readiness == ReadinessShutdown || o.SAC == SACShutdown
}

// failed notes err as the caller's last error and gives it back.
func (r *runner) failed(err error) error {
	r.lastErr = err
	return err
}

func podErr(err error) map[string]any {
	kind := "api"
	switch {
	case errors.Is(err, ErrGone):
		kind = "gone"
	case errors.Is(err, ErrRefused):
		kind = "refused"
	}
	return map[string]any{"kind": kind, "message": err.Error()}
}

// knows is what the caller knows of the VM beyond its record, as the
// task option `knows`.
func (o RunOptions) knows() (map[string]any, error) {
	k := map[string]any{}
	switch o.Boot {
	case BootUnknown:
	case BootCreate, BootFork, BootWake, BootWakeInPlace, BootResume:
		k["boot"] = string(o.Boot)
	default:
		return nil, invalid("RunOptions.Boot %q is not a Boot", string(o.Boot))
	}
	if o.SourceImage != "" {
		k["source_image"] = o.SourceImage
	}
	return k, nil
}

// inspect reads the VM's record: the caller's typed record when its VM
// gives one (what it leaves empty noted as lacking), else the raw one.
func (r *runner) inspect(ctx context.Context, vm string, timeout time.Duration) ([]byte, error) {
	typed, ok := r.vm.(RecordInspector)
	if !ok {
		return r.vm.Inspect(ctx, vm, timeout)
	}
	record, err := typed.InspectRecord(ctx, vm, timeout)
	if err != nil {
		return nil, err
	}
	if record == nil {
		return nil, fmt.Errorf("InspectRecord returned no record and no error for %s", vm)
	}
	r.lacks = r.lacks[:0]
	if record.Config.Image == "" {
		r.lacks = append(r.lacks, "image")
	}
	if _, err := time.Parse(time.RFC3339Nano, record.CreatedAt); err != nil {
		r.lacks = append(r.lacks, "created_at")
	}
	return json.Marshal(record)
}

// rawOrNull is a pod document, or null for none.
func rawOrNull(doc []byte) any {
	if len(doc) == 0 {
		return nil
	}
	return json.RawMessage(doc)
}

func raws(docs [][]byte) []json.RawMessage {
	out := make([]json.RawMessage, 0, len(docs))
	for _, d := range docs {
		out = append(out, json.RawMessage(d))
	}
	return out
}

// millis is a duration the task gives in milliseconds.
func millis(n int64) time.Duration { return time.Duration(n) * time.Millisecond }

// outputMax is how much of an exec's stdout and stderr Run hands on: the
// ends, where the step markers and the errors are.
const outputMax = 64 << 10

// tailOf is the last outputMax bytes of b, and whether bytes were cut.
func tailOf(b []byte) ([]byte, bool) {
	if len(b) > outputMax {
		return b[len(b)-outputMax:], true
	}
	return b, false
}

// metadataOnly is a pod as its metadata alone, all the node's pod list
// needs.
func metadataOnly(doc []byte) json.RawMessage {
	var pod struct {
		Metadata json.RawMessage `json:"metadata"`
	}
	if json.Unmarshal(doc, &pod) != nil || len(pod.Metadata) == 0 {
		return json.RawMessage(doc)
	}
	out, _ := json.Marshal(map[string]json.RawMessage{"metadata": pod.Metadata})
	return out
}

// uncancelled is parent's values without its cancel, bounded by
// nonInterruptible: the reads, writes and events of a step run to their
// end after a cancel, as the daemon's do, so that nothing it has decided
// is lost half-way.
func uncancelled(parent context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(valuesOf{parent}, nonInterruptible)
}

// nonInterruptible bounds an action that a cancel does not interrupt.
const nonInterruptible = 60 * time.Second

type valuesOf struct{ parent context.Context }

func (v valuesOf) Deadline() (time.Time, bool) { return time.Time{}, false }
func (v valuesOf) Done() <-chan struct{}       { return nil }
func (v valuesOf) Err() error                  { return nil }
func (v valuesOf) Value(key any) any           { return v.parent.Value(key) }

func (r *runner) carryOut(ctx context.Context, a action, raw json.RawMessage) map[string]any {
	if interruptible[a.Action] {
		report := r.interruptible(ctx, a, raw)
		if ctx.Err() != nil {
			// Whatever the action says, a cancel came during it: the
			// step hears a shutdown, never a failure.
			return map[string]any{"cancelled": true}
		}
		return report
	}
	ctx, done := uncancelled(ctx)
	defer done()
	return r.settled(ctx, a)
}

// interruptible carries out the actions a cancel interrupts.
func (r *runner) interruptible(ctx context.Context, a action, raw json.RawMessage) map[string]any {
	switch a.Action {
	case "admit":
		if r.o.Admission != nil {
			if !r.o.Admission.acquire(ctx) {
				return map[string]any{"cancelled": true}
			}
			r.admitted = true
		}
		return map[string]any{"go": true}
	case "checkpoint":
		return map[string]any{"go": true}
	case "exec":
		r.lastErr = nil
		res, err := r.vm.Exec(ctx, a.VM, a.Argv, millis(a.TimeoutMS))
		if err != nil {
			return map[string]any{"exec_error": r.failed(err).Error()}
		}
		stdout, _ := tailOf(res.Stdout)
		stderr, cut := tailOf(res.Stderr)
		ran := map[string]any{"stdout": string(stdout), "stderr": string(stderr), "stderr_cut": res.StderrCut || cut}
		if res.Signal != 0 {
			ran["signal"] = res.Signal
		} else {
			ran["exit"] = res.ExitCode
		}
		return map[string]any{"ran": ran}
	case "sleep":
		if err := r.clock.SleepUntil(ctx, r.at(a.UntilMS)); err != nil {
			return map[string]any{"cancelled": true}
		}
		return map[string]any{"go": true}
	case "wait_lease":
		return r.waitLease(ctx, a.MAC, r.at(a.UntilMS))
	case "sac_open":
		return r.console.open(ctx, raw)
	case "sac_set":
		return r.console.set(ctx, raw)
	}
	return map[string]any{"go": true}
}

// settled carries out the actions a cancel does not interrupt.
func (r *runner) settled(ctx context.Context, a action) map[string]any {
	switch a.Action {
	case "release":
		if r.admitted {
			r.o.Admission.release()
			r.admitted = false
		}
		return map[string]any{"go": true}
	case "note":
		r.log(a.Level, deref(a.Message))
		return map[string]any{"go": true}
	case "inspect":
		r.lastErr = nil
		doc, err := r.inspect(ctx, a.VM, millis(a.TimeoutMS))
		if err != nil {
			// The library decides what a VM that does not exist means.
			if errors.Is(err, ErrVMGone) {
				return map[string]any{"inspect_gone": r.failed(err).Error()}
			}
			return map[string]any{"inspect_error": r.failed(err).Error()}
		}
		if !json.Valid(doc) {
			return map[string]any{"inspect_error": "cocoon vm inspect printed no JSON"}
		}
		if len(r.lacks) > 0 {
			return map[string]any{"inspected": json.RawMessage(doc), "record_lacks": r.lacks}
		}
		return map[string]any{"inspected": json.RawMessage(doc)}
	case "other_pods":
		lister, ok := r.pods.(NodePodLister)
		if !ok {
			return map[string]any{"other_pods_error": "this program does not list its node's pods (its Pods has no NodePods)"}
		}
		docs, err := lister.NodePods(ctx)
		if err != nil {
			return map[string]any{"other_pods_error": err.Error()}
		}
		pods := make([]json.RawMessage, 0, len(docs))
		for _, doc := range docs {
			pods = append(pods, metadataOnly(doc))
		}
		return map[string]any{"other_pods": pods}
	case "wake_events":
		lister, ok := r.pods.(EventLister)
		if !ok {
			if _, old := r.pods.(oldEventLister); old {
				return map[string]any{"events_error": "this program's Pods has PodEvents, which this version of the package no longer calls: implement ListEvents(ctx, namespace, fieldSelector) instead"}
			}
			return map[string]any{"events_error": "this program does not list events (its Pods has no ListEvents)"}
		}
		var docs [][]byte
		key := "events"
		for _, selector := range a.FieldSelectors {
			listed, err := lister.ListEvents(ctx, a.Namespace, selector)
			if errors.Is(err, ErrEventsTruncated) {
				key, err = "events_truncated", nil
			}
			if err != nil {
				return map[string]any{"events_error": err.Error()}
			}
			docs = append(docs, listed...)
		}
		return map[string]any{key: raws(docs)}
	case "read":
		r.lastErr = nil
		doc, err := r.pods.Get(ctx, r.meta.Namespace, r.meta.Name)
		if err != nil {
			return map[string]any{"read_error": podErr(r.failed(err))}
		}
		return map[string]any{"read": rawOrNull(doc)}
	case "patch":
		r.lastErr = nil
		// Never nil: a merge patch of `annotations: null` would remove
		// every annotation.
		patch := PodPatch{Annotations: a.Annotations, UID: a.UID}
		if patch.Annotations == nil {
			patch.Annotations = Patch{}
		}
		if a.ResourceVersion != nil {
			patch.ResourceVersion = *a.ResourceVersion
		}
		doc, err := r.pods.PatchAnnotations(ctx, r.meta.Namespace, r.meta.Name, patch)
		switch {
		case err == nil:
			return map[string]any{"patched": rawOrNull(doc)}
		case errors.Is(err, ErrConflict):
			if len(doc) == 0 {
				now, rerr := r.pods.Get(ctx, r.meta.Namespace, r.meta.Name)
				if rerr != nil {
					return map[string]any{"patch_error": podErr(rerr)}
				}
				if now == nil {
					return map[string]any{"patch_error": podErr(ErrGone)}
				}
				doc = now
			}
			return map[string]any{"changed": json.RawMessage(doc)}
		default:
			return map[string]any{"patch_error": podErr(r.failed(err))}
		}
	case "tell":
		if err := r.pods.Event(ctx, r.meta.Namespace, r.meta.Name, r.meta.UID, Event{Type: a.Type, Reason: a.Reason, Message: deref(a.Message), Action: a.EventAction}); err != nil {
			r.log("warn", fmt.Sprintf("the %s event was not recorded: %v", a.Reason, err))
		}
		return map[string]any{"go": true}
	case "remember":
		if r.o.Records != nil && r.meta.UID != "" {
			if err := r.p.keepTaskRecord(ctx, r.o.Records, r.meta.UID, a.Record); err != nil {
				r.log("warn", "the pod's record was not kept: "+err.Error())
			}
		}
		return map[string]any{"go": true}
	case "sac_close":
		r.console.close()
		return map[string]any{"go": true}
	case "publish":
		if r.o.Lifecycle == nil {
			r.log("error", "the task handed over a lifecycle change though Run writes the lifecycle itself")
			return map[string]any{"go": true}
		}
		intent := LifecycleIntent{State: LifecycleState(deref(a.State)), Message: deref(a.Message), ObservedGeneration: deref(a.ObservedGeneration), IP: deref(a.IP), Ready: a.Ready}
		pod := PodRef{Namespace: r.meta.Namespace, Name: r.meta.Name, UID: r.meta.UID, ResourceVersion: deref(a.ResourceVersion)}
		if err := r.o.Lifecycle.Publish(ctx, pod, intent); err != nil {
			r.log("warn", fmt.Sprintf("the lifecycle change (%s) was not published: %v", intent, err))
			if r.unpublished == nil {
				r.unpublished = &PublishError{Intent: intent, Err: err}
			}
		}
		return map[string]any{"go": true}
	}
	return map[string]any{"go": true}
}

// libraryConsole is the library's serial console: the library carries
// out the task's own pending console action (the VM, the addresses and
// the pass's total deadline are the task's; the console lives in the
// task until its sac_close), every wait in it bounded. A cancel of ctx
// (Close cancels it too) cancels the task's console work at once, and
// the op returns within about 100 ms; carryOut then reports the cancel.
type libraryConsole struct {
	p    *Planner
	c    *conn
	task *uint64
}

func (c *libraryConsole) open(ctx context.Context, action json.RawMessage) map[string]any {
	return c.call(ctx, "console_open", "sac_open_error")
}

func (c *libraryConsole) set(ctx context.Context, action json.RawMessage) map[string]any {
	return c.call(ctx, "console_set", "sac_set_error")
}

// call carries out one console op of the task; ctx's end cancels it.
func (c *libraryConsole) call(ctx context.Context, op, errorKey string) map[string]any {
	finished := make(chan struct{})
	defer close(finished)
	go func() {
		select {
		case <-ctx.Done():
			// Never abandoned: the op must hear it. Straight to the
			// session, past the planner's lock: Close may be waiting
			// for it (behind the op in flight), and the session outlives
			// this Run.
			send(context.Background(), c.c, map[string]any{"op": "task_cancel", "task": *c.task})
		case <-finished:
		}
	}()
	// Not abandoned on cancel either: the op ends at once when cancelled,
	// and the task must hear how its action ended.
	var report map[string]any
	if err := c.p.callOnInto(context.Background(), c.c, map[string]any{"op": op, "task": *c.task}, &report); err != nil {
		if ctx.Err() != nil {
			return map[string]any{"cancelled": true}
		}
		return map[string]any{errorKey: map[string]any{"kind": "refused", "message": err.Error()}}
	}
	return report
}

// close does nothing: the library closed the task's console when the task
// handed out sac_close, or finished.
func (c *libraryConsole) close() {}

func (r *runner) waitLease(ctx context.Context, mac string, until time.Time) map[string]any {
	if r.o.Leases == nil {
		r.o.Leases = r.p.LeaseFile()
	}
	if waiter, ok := r.o.Leases.(LeaseWaiter); ok {
		ip, err := waiter.WaitLease(ctx, mac, until)
		switch {
		case err == nil && ip != "":
			return map[string]any{"lease": ip}
		case err == nil:
			return map[string]any{"lease": nil}
		default:
			// A cancel meanwhile is reported by carryOut.
			return map[string]any{"lease_error": err.Error()}
		}
	}
	every := r.o.Settings.PollLeasesEvery
	if every <= 0 {
		every = 200 * time.Millisecond
	}
	for {
		ip, err := r.o.Leases.Lease(ctx, mac)
		if err == nil && ip != "" {
			return map[string]any{"lease": ip}
		}
		now := r.clock.Now()
		if !now.Before(until) {
			if err != nil {
				return map[string]any{"lease_error": err.Error()}
			}
			return map[string]any{"lease": nil}
		}
		next := now.Add(every)
		if next.After(until) {
			next = until
		}
		if r.clock.SleepUntil(ctx, next) != nil {
			return map[string]any{"cancelled": true}
		}
	}
}

// LeaseFile is cocoon-net's lease file as the library reads it
// (Options.LeaseFile, default /var/lib/cocoon/net/leases.json), as the
// daemon's watcher reads it: each Lease is one bounded look at the file
// (no file yet holds no lease; one that is no regular file, is too large
// or is no list of leases is an error). Run uses it when
// RunOptions.Leases is nil.
func (p *Planner) LeaseFile() Leases { return leaseFile{p} }

type leaseFile struct{ p *Planner }

func (l leaseFile) Lease(ctx context.Context, mac string) (string, error) {
	var answer struct {
		Lease *string `json:"lease"`
		Error *string `json:"lease_error"`
	}
	if err := l.p.callInto(ctx, map[string]any{"op": "lease", "planner": own{}, "mac": mac}, &answer); err != nil {
		return "", err
	}
	if answer.Error != nil {
		return "", errors.New(*answer.Error)
	}
	if answer.Lease == nil {
		return "", nil
	}
	return *answer.Lease, nil
}

// usableVM refuses a StreamVM that lacks one of its calls before anything
// is read: a missing Stream would fail every attempt and mark the pod
// failed, a missing Record would retry forever.
func usableVM(vm VM) error {
	var s StreamVM
	switch v := vm.(type) {
	case StreamVM:
		s = v
	case *StreamVM:
		if v == nil {
			return invalid("Run's VM is a nil *StreamVM")
		}
		s = *v
	default:
		return nil
	}
	if s.Stream == nil || s.Record == nil {
		return invalid("Run's StreamVM needs both Stream and Record")
	}
	return nil
}
