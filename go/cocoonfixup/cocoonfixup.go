// Package cocoonfixup embeds cocoon-fixup's plan path in a Go program:
// which clones need a post-clone fixup, the plan (the exec argv, the hint
// script), the decision of spec section 8, and the exact annotation values
// and events the fixup loop writes. It calls libcocoon_fixup (the crate
// host/capi) through cgo; the caller keeps its own cocoon client,
// Kubernetes client, goroutines and retry loop.
//
// Build the library first and tell the Go linker where it is:
//
//	cargo build --release -p fixup-capi
//	CGO_LDFLAGS="-L$PWD/target/release" go build ./...
//
// The static archive is linked by default; -tags cocoonfixup_dynamic links
// the shared library instead.
//
// A Planner is built once, is safe for use by many goroutines at once, and
// must be closed with Close: finalizers only catch a forgotten Close.
package cocoonfixup

// #cgo CFLAGS: -I${SRCDIR}/../../host/capi/include
// #include <stdlib.h>
// #include "cocoon_fixup.h"
import "C"

import (
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"
	"unsafe"
)

// ABIVersion is the version of the C ABI this package was written for.
const ABIVersion = 2

// Code is the kind of an Error: switch on it, the message is for people.
type Code int32

// The codes of the C ABI (CfStatus in cocoon_fixup.h).
const (
	CodeInvalidArgument Code = C.CF_INVALID_ARGUMENT // the caller broke the contract (a bug in the caller)
	CodeBadInput        Code = C.CF_BAD_INPUT        // the pod JSON is not what kubectl prints
	CodeBadFacts        Code = C.CF_BAD_FACTS        // the facts contradict each other or do not validate
	CodeNode            Code = C.CF_NODE             // the node is at fault (cocoon root, plugin directory, engine, a plugin's deadline): retry, do not fail the pod
	CodeNoPlugin        Code = C.CF_NO_PLUGIN        // no plugin serves the scenario and flavour
	CodePluginLimit     Code = C.CF_PLUGIN_LIMIT     // a plugin hit a sandbox limit (fuel, memory, output)
	CodePluginPolicy    Code = C.CF_PLUGIN_POLICY    // a plugin planned past its guest policy
	CodePluginDeclined  Code = C.CF_PLUGIN_DECLINED  // a plugin does not support the VM, or rejected a fact
	CodePluginFailed    Code = C.CF_PLUGIN_FAILED    // a plugin trapped, panicked, or returned an unusable plan
	CodePlanRejected    Code = C.CF_PLAN_REJECTED    // the plans cannot be combined or break the plan limits
	CodeLoad            Code = C.CF_LOAD             // the planner could not be built
	CodePanic           Code = C.CF_PANIC            // the library panicked (a bug: please report it; build a new Planner)
	CodeVMMismatch      Code = C.CF_VM_MISMATCH      // the VM is not the pod's: run nothing, publish no IP (VMMismatch gives the event)
	CodeBadRecord       Code = C.CF_BAD_RECORD       // the VM record is not what cocoon prints: retry, do not fail the pod
)

var codeNames = map[Code]string{
	CodeInvalidArgument: "invalid-argument",
	CodeBadInput:        "bad-input",
	CodeBadFacts:        "bad-facts",
	CodeNode:            "node",
	CodeNoPlugin:        "no-plugin",
	CodePluginLimit:     "plugin-limit",
	CodePluginPolicy:    "plugin-policy",
	CodePluginDeclined:  "plugin-declined",
	CodePluginFailed:    "plugin-failed",
	CodePlanRejected:    "plan-rejected",
	CodeLoad:            "load",
	CodePanic:           "panic",
	CodeVMMismatch:      "vm-mismatch",
	CodeBadRecord:       "bad-record",
}

func (c Code) String() string {
	if name, ok := codeNames[c]; ok {
		return name
	}
	return fmt.Sprintf("code-%d", int32(c))
}

// Error is what the library reports when a call fails.
type Error struct {
	Code    Code
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("cocoon-fixup (%s): %s", e.Code, e.Message)
}

// PlanFailed reports whether the error means no plan can be made for the
// pod, so that the pod is failed without a hint (the PlanFailed record), as
// the daemon fails it. Not for a VM that is not the pod's (CodeVMMismatch:
// an event, nothing written), an error a retry may clear (Retryable), or a
// bug in the caller.
func (e *Error) PlanFailed() bool {
	switch e.Code {
	case CodeBadFacts, CodeNoPlugin, CodePluginLimit, CodePluginPolicy,
		CodePluginDeclined, CodePluginFailed, CodePlanRejected:
		return true
	}
	return false
}

// Retryable reports whether the node, not the pod, is at fault: try the
// pod again later and leave it as it is.
func (e *Error) Retryable() bool {
	return e.Code == CodeNode || e.Code == CodeBadRecord
}

// ErrClosed is returned by calls on a closed Planner.
var ErrClosed = &Error{Code: CodeInvalidArgument, Message: "the planner is closed"}

func init() {
	if v := int(C.cf_abi_version()); v != ABIVersion {
		panic(fmt.Sprintf("cocoonfixup: libcocoon_fixup has ABI version %d, this package needs %d: rebuild the library from the same checkout", v, ABIVersion))
	}
}

// take turns a call's status and output string into a document or an
// Error, and frees the string.
func take(status C.CfStatus, out *C.char) ([]byte, error) {
	if out == nil {
		code := Code(status)
		if status == C.CF_OK {
			code = CodeInvalidArgument
		}
		return nil, &Error{Code: code, Message: "the library returned no answer"}
	}
	text := C.GoString(out)
	C.cf_string_free(out)
	if status != C.CF_OK {
		return nil, &Error{Code: Code(status), Message: text}
	}
	return []byte(text), nil
}

// cBytes is a pointer to b's first byte for C, or nil for an empty slice.
// The bytes hold no Go pointers, so cgo lets C read them during the call.
func cBytes(b []byte) (*C.uint8_t, C.size_t) {
	if len(b) == 0 {
		return nil, 0
	}
	return (*C.uint8_t)(unsafe.Pointer(&b[0])), C.size_t(len(b))
}

// cString is s in C memory; the caller frees it.
func cString(s string) *C.char {
	return C.CString(s)
}

// Limits bound each plugin call; zero fields take the host's defaults.
type Limits struct {
	Fuel         uint64        // CPU fuel per call (default 250,000,000, about 10 ms)
	Deadline     time.Duration // wall-clock time per call (default 1s)
	MemoryMiB    uint32        // linear memory per call (default 16)
	PlanMaxSteps int           // steps in a plan (default 256)
	PlanMaxBytes int           // bytes of text in a plan (default 65536)
	Slots        uint32        // concurrent plugin instances reserved (default 64)
}

// GuestPolicy is an operator's narrowing of a plugin's guest policy, as
// [plugin_policy.NAME] in the configuration file.
type GuestPolicy struct {
	Writes       []string   `json:"writes,omitempty"`
	Removes      []string   `json:"removes,omitempty"`
	Runs         [][]string `json:"runs,omitempty"`
	SpecialModes bool       `json:"special_modes,omitempty"`
	// Links are patterns of the interface names name_link steps may give
	// (contract 0.3.0 plugins); left empty, a narrowing allows none.
	Links []string `json:"links,omitempty"`
}

// Options set up a Planner. The zero value is the daemon's defaults. The
// daemon's configuration file (/etc/cocoon-fixup/config.toml) is not read:
// pass its allow-list and policy narrowing here.
type Options struct {
	// PluginDir holds vendor plugins (*.wasm); "" is the default,
	// /etc/cocoon-fixup/plugins when it exists. NoPluginDir loads none.
	PluginDir   string
	NoPluginDir bool
	// CacheDir holds precompiled plugins; "" is the default
	// (/var/cache/cocoon-fixup as root, else ~/.cache/cocoon-fixup).
	// NoCache compiles the plugins every time a Planner is built.
	CacheDir string
	CacheKey string
	NoCache  bool
	// CocoonRoot is where the overlay probe looks (default /var/lib/cocoon).
	CocoonRoot string
	Limits     Limits
	// AllowedPlugins, when not empty, are the sha256 digests of the only
	// plugin files that may load. Built-ins are always trusted.
	AllowedPlugins []string
	// PluginPolicy narrows plugins' guest policies, by plugin name.
	PluginPolicy map[string]GuestPolicy
	// AcceptLegacyVMNames also binds VMs named vk-<namespace>-<pod>.
	AcceptLegacyVMNames bool
	// Strict fails NewPlanner when a plugin file does not load (as
	// `cocoon-fixup plan` does); otherwise the others serve (as `serve`
	// does) and LoadFailures lists them.
	Strict bool
}

func (o Options) document() ([]byte, error) {
	doc := map[string]any{}
	switch {
	case o.NoPluginDir:
		doc["plugin_dir"] = ""
	case o.PluginDir != "":
		doc["plugin_dir"] = o.PluginDir
	}
	set := func(key string, value any, present bool) {
		if present {
			doc[key] = value
		}
	}
	set("cache_dir", o.CacheDir, o.CacheDir != "")
	set("cache_key", o.CacheKey, o.CacheKey != "")
	set("no_cache", true, o.NoCache)
	set("cocoon_root", o.CocoonRoot, o.CocoonRoot != "")
	l := o.Limits
	set("plugin_fuel", l.Fuel, l.Fuel != 0)
	set("plugin_deadline_ms", l.Deadline.Milliseconds(), l.Deadline != 0)
	set("plugin_memory_mib", l.MemoryMiB, l.MemoryMiB != 0)
	set("plan_max_steps", l.PlanMaxSteps, l.PlanMaxSteps != 0)
	set("plan_max_bytes", l.PlanMaxBytes, l.PlanMaxBytes != 0)
	set("slots", l.Slots, l.Slots != 0)
	set("allowed_plugins", o.AllowedPlugins, len(o.AllowedPlugins) != 0)
	set("plugin_policy", o.PluginPolicy, len(o.PluginPolicy) != 0)
	set("accept_legacy_vm_names", true, o.AcceptLegacyVMNames)
	set("strict", true, o.Strict)
	return json.Marshal(doc)
}

// LoadFailure is a plugin file that did not load.
type LoadFailure struct {
	Path  string `json:"path"`
	Error string `json:"error"`
}

// Planner classifies and plans. Build it once with NewPlanner, share it
// between goroutines, and Close it.
type Planner struct {
	mu       sync.RWMutex
	ptr      *C.cf_planner
	failures []LoadFailure
	warnings []string
	// One token per engine slot: goroutines beyond them wait here, in Go,
	// not on an OS thread inside the library.
	slots        chan struct{}
	acceptLegacy bool
}

// NewPlanner starts the plugin engine and loads the built-in plugins and
// the plugin directory.
func NewPlanner(o Options) (*Planner, error) {
	doc, err := o.document()
	if err != nil {
		return nil, &Error{Code: CodeInvalidArgument, Message: err.Error()}
	}
	options := cString(string(doc))
	defer C.free(unsafe.Pointer(options))
	var ptr *C.cf_planner
	var out *C.char
	status := C.cf_planner_new(options, &ptr, &out)
	answer, err := take(status, out)
	if err != nil {
		return nil, err
	}
	var loaded struct {
		LoadFailures []LoadFailure `json:"load_failures"`
		Warnings     []string      `json:"warnings"`
		Slots        int           `json:"slots"`
	}
	if err := json.Unmarshal(answer, &loaded); err != nil {
		C.cf_planner_free(ptr)
		return nil, &Error{Code: CodeInvalidArgument, Message: "reading the planner's answer: " + err.Error()}
	}
	if loaded.Slots < 1 {
		loaded.Slots = 1
	}
	p := &Planner{ptr: ptr, failures: loaded.LoadFailures, warnings: loaded.Warnings,
		slots: make(chan struct{}, loaded.Slots), acceptLegacy: o.AcceptLegacyVMNames}
	runtime.SetFinalizer(p, (*Planner).Close)
	return p, nil
}

// LoadFailures lists the plugin files that did not load (never with
// Options.Strict, which fails NewPlanner instead).
func (p *Planner) LoadFailures() []LoadFailure {
	return append([]LoadFailure(nil), p.failures...)
}

// Warnings lists what the operator should know about the options, such as
// a policy narrowing for a plugin that is not loaded.
func (p *Planner) Warnings() []string { return append([]string(nil), p.warnings...) }

// VMMismatch is the PostCloneVMMismatch event for a pod whose VM record is
// not its own under this planner's binding policy, or nil when it is.
func (p *Planner) VMMismatch(pod, vm []byte) (*Event, error) {
	return VMMismatch(pod, vm, p.acceptLegacy)
}

// Close frees the planner. It waits for calls in flight; later calls
// return ErrClosed. Closing twice is harmless.
func (p *Planner) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ptr != nil {
		C.cf_planner_free(p.ptr)
		p.ptr = nil
	}
	runtime.SetFinalizer(p, nil)
	return nil
}

// call runs f with the live planner, holding off Close until it returns.
func (p *Planner) call(f func(*C.cf_planner) ([]byte, error)) ([]byte, error) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.ptr == nil {
		return nil, ErrClosed
	}
	return f(p.ptr)
}

// Overrides replace what the pod's annotations say, as `plan --boot` and
// `plan --source-image` do.
type Overrides struct {
	Boot        string // "clone", "fork", "wake", "resumed", or "" for the annotations' answer
	SourceImage string // the snapshot's source image, or ""
}

// Plan classifies a pod's VM and, when it needs a fixup, plans it. pod is
// `kubectl get pod NAME -o json` output (or the same object as the API
// returns it), vm is `cocoon vm inspect --json ID` output. A VM that is not
// the pod's own is refused first (CodeVMMismatch), before anything looks at
// it. The report is the one `cocoon-fixup plan --output json` prints, with
// the binding verdict and the plan's seal. Work left `running` is planned
// as resumed work, as the daemon plans it, unless o says otherwise.
func (p *Planner) Plan(pod, vm []byte, o Overrides) (*Report, error) {
	overrides, err := json.Marshal(map[string]any{"boot": nonEmpty(o.Boot), "source_image": nonEmpty(o.SourceImage)})
	if err != nil {
		return nil, &Error{Code: CodeInvalidArgument, Message: err.Error()}
	}
	cOverrides := cString(string(overrides))
	defer C.free(unsafe.Pointer(cOverrides))
	p.slots <- struct{}{}
	defer func() { <-p.slots }()
	doc, err := p.call(func(ptr *C.cf_planner) ([]byte, error) {
		podPtr, podLen := cBytes(pod)
		vmPtr, vmLen := cBytes(vm)
		var out *C.char
		status := C.cf_plan(ptr, podPtr, podLen, vmPtr, vmLen, cOverrides, &out)
		runtime.KeepAlive(pod)
		runtime.KeepAlive(vm)
		return take(status, out)
	})
	if err != nil {
		return nil, err
	}
	return parseReport(doc)
}

func nonEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// NewAttempt starts one attempt of the report's plan: the argv to run
// after `cocoon vm exec <id> --`, under a fresh nonce. Each exec needs its
// own attempt. The plan must carry this planner's seal: only plans it made
// are rendered.
func (p *Planner) NewAttempt(r *Report) (*Attempt, error) {
	if r == nil || !r.NeedsFixup || len(r.plan) == 0 {
		return nil, &Error{Code: CodeInvalidArgument, Message: "the report has no plan to attempt"}
	}
	if !r.Bound() {
		return nil, &Error{Code: CodeVMMismatch, Message: "the report's VM is not the pod's: nothing may run in it"}
	}
	plan := cString(string(r.plan))
	defer C.free(unsafe.Pointer(plan))
	doc, err := p.call(func(ptr *C.cf_planner) ([]byte, error) {
		var out *C.char
		return take(C.cf_attempt(ptr, plan, &out), out)
	})
	if err != nil {
		return nil, err
	}
	a := &Attempt{plan: r.plan}
	if err := json.Unmarshal(doc, a); err != nil {
		return nil, &Error{Code: CodeInvalidArgument, Message: "reading the attempt: " + err.Error()}
	}
	return a, nil
}

// Attempt is one exec of a plan.
type Attempt struct {
	// VMID is the VM the plan was made and sealed for: run
	// `cocoon vm exec <VMID> -- Argv...`.
	VMID string `json:"vm_id"`
	// Nonce marks this exec's step markers. It is the last word of Argv,
	// except for a plan of one run step, which runs directly, has no
	// markers, and is judged by its exit code.
	Nonce string `json:"nonce"`
	// Argv is what to run after `cocoon vm exec <id> --`.
	Argv []string `json:"argv"`
	plan []byte
}

// ExecResult is what one exec left behind.
type ExecResult struct {
	ExitCode int    // the exit code, when Signal is 0
	Signal   int    // the signal that killed the process, or 0
	Stderr   []byte // the end of stderr: keep at least the last 64 KiB
	// StderrCut says earlier stderr bytes were dropped.
	StderrCut bool
}

// StepFailure names where a failed exec stopped.
type StepFailure struct {
	// Kind is "step" (a step failed), "interrupted" (cut off while a step
	// ran), "not-started" or "after-last-step".
	Kind        string  `json:"kind"`
	Step        *int    `json:"step"`
	Total       *int    `json:"total"`
	Description *string `json:"description"`
	ExitCode    *int    `json:"exit_code"`
	Stderr      string  `json:"stderr"`
	StderrCut   bool    `json:"stderr_cut"`
}

// Verdict is the judgement on one exec.
type Verdict struct {
	// OK: the exec ran every step (exit 0 and this attempt's done marker).
	OK bool `json:"ok"`
	// Error is the attempt's error as one line (for AttemptFailed).
	Error   string       `json:"error"`
	Failure *StepFailure `json:"failure"`
}

// Judge says whether the exec of this attempt ran to completion, and if
// not, which step failed and what it printed.
func (a *Attempt) Judge(res ExecResult) (*Verdict, error) {
	plan := cString(string(a.plan))
	defer C.free(unsafe.Pointer(plan))
	nonce := cString(a.Nonce)
	defer C.free(unsafe.Pointer(nonce))
	errPtr, errLen := cBytes(res.Stderr)
	var out *C.char
	status := C.cf_verdict(plan, nonce, C.int32_t(res.ExitCode), C.int32_t(res.Signal), errPtr, errLen, C.bool(res.StderrCut), &out)
	runtime.KeepAlive(res.Stderr)
	doc, err := take(status, out)
	if err != nil {
		return nil, err
	}
	var v Verdict
	if err := json.Unmarshal(doc, &v); err != nil {
		return nil, &Error{Code: CodeInvalidArgument, Message: "reading the verdict: " + err.Error()}
	}
	return &v, nil
}

// Action is what spec section 8 says to do with a pod.
type Action string

const (
	Nothing    Action = "nothing"      // leave the pod alone (Why says why)
	Parked     Action = "parked"       // the fixup failed earlier: the work stays parked
	RunLoop    Action = "run-loop"     // run the fixup loop (again)
	IPWaitOnly Action = "ip-wait-only" // the fixup is done or not needed: wait for the IP
	NeedsFacts Action = "needs-facts"  // Gate only: the VM must be looked at first
)

// Decision is spec section 8's answer for a pod.
type Decision struct {
	Action Action `json:"action"`
	// Why names the reason for Nothing: stack-owns, hibernate-requested,
	// deleting, not-managed, not-cloned.
	Why string `json:"why"`
	// Op is the ResumedAfterRestart op of work that resumes: post_clone or
	// ready_wait.
	Op string `json:"op"`
	// Marker is the pod's post-clone-state as the table read it: running,
	// done, or "". With done the fixup is over: wait for the IP, do not
	// plan.
	Marker string `json:"marker"`
}

func decide(pod []byte, needed C.int32_t) (Decision, error) {
	podPtr, podLen := cBytes(pod)
	var out *C.char
	status := C.cf_decide(podPtr, podLen, needed, &out)
	runtime.KeepAlive(pod)
	doc, err := take(status, out)
	if err != nil {
		return Decision{}, err
	}
	var d struct {
		Action Action  `json:"action"`
		Why    *string `json:"why"`
		Op     *string `json:"op"`
		Marker *string `json:"marker"`
	}
	if err := json.Unmarshal(doc, &d); err != nil {
		return Decision{}, &Error{Code: CodeInvalidArgument, Message: "reading the decision: " + err.Error()}
	}
	return Decision{Action: d.Action, Why: deref(d.Why), Op: deref(d.Op), Marker: deref(d.Marker)}, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// Decide is spec section 8 for a pod, given whether its VM needs a fixup
// (the report's NeedsFixup): the same table the daemon decides with.
func Decide(pod []byte, fixupNeeded bool) (Decision, error) {
	if fixupNeeded {
		return decide(pod, 1)
	}
	return decide(pod, 0)
}

// Gate is the part of spec section 8 that needs only the pod: call it on
// every pod event, before asking cocoon anything. NeedsFacts means: look
// at the VM, plan, then Decide.
func Gate(pod []byte) (Decision, error) {
	return decide(pod, -1)
}

// errorsOf unwraps an Error.
func errorsOf(err error) (*Error, bool) {
	var e *Error
	ok := errors.As(err, &e)
	return e, ok
}
