// Package cocoonfixup carries out cocoon-fixup's post-clone step for a
// pod in a Go program, as the node daemon does: Run decides and does the
// whole step (which VM, whether it is the pod's, the fixup with its retry
// budget, the Windows serial-console pass, the IP wait with its DHCP
// recovery and renew nudge, every annotation and event), calling back into
// the caller only for what the caller owns: exec and inspect in the VM,
// and reads, patches and events through its Kubernetes client. Run is the
// one way to embed the step: the library decides everything, a stop
// included (when and how to run the pod again), and the caller only
// carries it out. Plan shows what the step would run, and Observe keeps
// what the caller's watch sees for the next Run.
//
// Two backends speak the same JSON ops to the same library:
//
//   - process (the default, any GOOS/GOARCH, cgo on or off): one
//     long-lived child, `cocoon-fixup embed`, over a pipe. The binary is
//     installed on the node beside cocoon and cocoon-net (a static build,
//     e.g. /usr/local/bin/cocoon-fixup) and found by Options.Binary, else
//     COCOON_FIXUP_BIN, else cocoon-fixup on PATH. NewPlanner checks its
//     ABI: a binary that is missing, does not answer or speaks another ABI
//     is an ErrConfig, which a retry does not mend.
//
//   - linked (cgo, opt-in by build tag): libcocoon_fixup is linked in.
//     Build it, then point the Go linker at it:
//
//     cargo build --release -p fixup-capi
//     CGO_LDFLAGS="-L$PWD/target/release" go build -tags cocoonfixup_linked ./...
//
//     -tags cocoonfixup_linked links the static archive,
//     -tags cocoonfixup_dynamic the shared library; either makes
//     BackendAuto the linked library, and either fails the build when
//     cgo is off.
//
// A Planner is built once, is safe for use by many goroutines at once, and
// must be closed with Close.
package cocoonfixup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Code is the kind of an Error: switch on it, or match the sentinel
// errors with errors.Is; the message is for people.
type Code int32

// The codes (the library's CfStatus).
const (
	CodeInvalidArgument Code = 1  // the caller broke the contract (a bug in the caller)
	CodeBadInput        Code = 2  // the pod is not what the API server returns
	CodeBadFacts        Code = 3  // the facts contradict each other or do not validate
	CodeNode            Code = 4  // the node is at fault (cocoon root, plugin directory, engine, a plugin's deadline): retry, do not fail the pod
	CodeNoPlugin        Code = 5  // no plugin serves the scenario and flavour
	CodePluginLimit     Code = 6  // a plugin hit a sandbox limit (fuel, memory, output)
	CodePluginPolicy    Code = 7  // a plugin planned past its guest policy
	CodePluginDeclined  Code = 8  // a plugin does not support the VM, or rejected a fact
	CodePluginFailed    Code = 9  // a plugin trapped, panicked, or returned an unusable plan
	CodePlanRejected    Code = 10 // the plans cannot be combined or break the plan limits
	CodeLoad            Code = 11 // the planner could not be built
	CodePanic           Code = 12 // the library panicked (a bug: please report it; build a new Planner)
	CodeVMMismatch      Code = 13 // the VM is not the pod's: run nothing, publish no IP
	CodeBadRecord       Code = 14 // the VM record is not what cocoon prints: retry, do not fail the pod
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

// Sentinel errors. An *Error matches the kinds it belongs to with
// errors.Is: ErrRetryable (CodeNode, CodeBadRecord), ErrPlanFailed (the
// codes PlanFailed names), ErrVMMismatch, ErrInvalidArgument, ErrBadInput.
var (
	// ErrClosed is returned by calls on a closed Planner.
	ErrClosed = errors.New("cocoonfixup: the planner is closed")
	// ErrUnavailable: the library cannot be reached for now (the
	// cocoon-fixup child died, and a new one is not yet serving). The node
	// is at fault: such errors match ErrRetryable too.
	ErrUnavailable = errors.New("cocoonfixup: the library is unavailable")
	// ErrConfig: the library cannot be reached as the program is built and
	// the node set up (the cocoon-fixup binary missing, not answering or
	// of another ABI; BackendLinked in a build without the library). The
	// message says what to install or build. A retry does not mend it: it
	// matches neither ErrUnavailable nor ErrRetryable.
	ErrConfig = errors.New("cocoonfixup: the library is not set up")
	// ErrRetryable: the node, not the pod, is at fault; try again later.
	ErrRetryable = errors.New("cocoonfixup: the node is at fault, retry later")
	// ErrPlanFailed: no plan can be made for the pod.
	ErrPlanFailed = errors.New("cocoonfixup: no plan can be made for the pod")
	// ErrVMMismatch: the VM is not the pod's own.
	ErrVMMismatch = errors.New("cocoonfixup: the VM is not the pod's")
	// ErrInvalidArgument: the caller broke the contract.
	ErrInvalidArgument = errors.New("cocoonfixup: invalid argument")
	// ErrBadInput: the pod is not what the API server returns.
	ErrBadInput = errors.New("cocoonfixup: the pod is not a Pod as the API server returns it")
)

// Error is what the library reports when a call fails.
type Error struct {
	Code    Code
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("cocoonfixup (%s): %s", e.Code, e.Message)
}

// Is matches the sentinel kinds e belongs to.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrRetryable:
		return e.Retryable()
	case ErrPlanFailed:
		return e.PlanFailed()
	case ErrVMMismatch:
		return e.Code == CodeVMMismatch
	case ErrInvalidArgument:
		return e.Code == CodeInvalidArgument
	case ErrBadInput:
		return e.Code == CodeBadInput
	}
	return false
}

// PlanFailed reports whether the error means no plan can be made for the
// pod: Run fails such a pod without a hint (PostClonePlanFailed), as the
// daemon fails it. Not for a VM that is not the pod's (CodeVMMismatch:
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

// unavailableError is an ErrUnavailable with what is missing; it is
// retryable.
type unavailableError struct{ message string }

func (e *unavailableError) Error() string { return ErrUnavailable.Error() + ": " + e.message }

func (e *unavailableError) Is(target error) bool {
	return target == ErrUnavailable || target == ErrRetryable
}

func unavailable(format string, args ...any) error {
	return &unavailableError{message: fmt.Sprintf(format, args...)}
}

// configError is an ErrConfig with what to install or build; it is not
// retryable.
type configError struct{ message string }

func (e *configError) Error() string { return ErrConfig.Error() + ": " + e.message }

func (e *configError) Is(target error) bool { return target == ErrConfig }

func configErr(format string, args ...any) error {
	return &configError{message: fmt.Sprintf(format, args...)}
}

// why is what err says, without the ErrUnavailable or ErrConfig prefix of
// its own.
func why(err error) string {
	switch e := err.(type) {
	case *unavailableError:
		return e.message
	case *configError:
		return e.message
	}
	return err.Error()
}

func invalid(format string, args ...any) error {
	return &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf(format, args...)}
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
	// Backend chooses the linked library or the child process; Binary is
	// the cocoon-fixup binary the child runs ("" is COCOON_FIXUP_BIN, or
	// cocoon-fixup on PATH).
	Backend Backend
	Binary  string
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
	// CocoonRoot is where the overlay probe and the serial console look
	// (default /var/lib/cocoon).
	CocoonRoot string
	// LeaseFile is cocoon-net's lease file (default
	// /var/lib/cocoon/net/leases.json), read by LeaseFile.
	LeaseFile string
	Limits    Limits
	// AllowedPlugins, when not empty, are the sha256 digests of the only
	// plugin files that may load. Built-ins are always trusted.
	AllowedPlugins []string
	// PluginPolicy narrows plugins' guest policies, by plugin name.
	PluginPolicy map[string]GuestPolicy
	// AcceptLegacyVMNames also binds VMs named vk-<namespace>-<pod>.
	AcceptLegacyVMNames bool
	// AcceptAnnotatedVMNames binds a VM named by the pod's
	// vm.cocoonstack.io/name when no other pod on the node claims the
	// name (the retired cocoon-webhook's Deployment slots); Run then asks
	// Pods.NodePods. Safe only where the admission policy is installed.
	AcceptAnnotatedVMNames bool
	// Strict fails NewPlanner when a plugin file does not load (as
	// `cocoon-fixup plan` does); otherwise the others serve (as `serve`
	// does) and LoadFailures lists them.
	Strict bool
	// Log, when set, hears what the planner does on its own: a library of
	// another release ("warn"), a BackendProcess child that died ("warn"),
	// the new one that took its place ("info"), one that did not start
	// ("error"). Not sent to the library.
	Log func(level, message string)
}

func (o Options) document() map[string]any {
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
	set("lease_file", o.LeaseFile, o.LeaseFile != "")
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
	set("accept_annotated_vm_names", true, o.AcceptAnnotatedVMNames)
	set("strict", true, o.Strict)
	return doc
}

// LoadFailure is a plugin file that did not load.
type LoadFailure struct {
	Path  string `json:"path"`
	Error string `json:"error"`
}

// Planner classifies, plans and decides. Build it once with NewPlanner,
// share it between goroutines, and Close it.
type Planner struct {
	opts    Options
	backend Backend
	// conn is the library session the planner lives in; a
	// BackendProcess child that died is replaced by a new one when a call
	// next needs it (at most once per restartPause).
	connMu     sync.Mutex
	conn       *conn
	restarted  time.Time
	pause      time.Duration // restartPause
	restarting *restart      // the restart under way, if one is
	// failed says why the last restart did not take, for the calls
	// within the pause after it.
	failed   error
	stopOnce sync.Once
	failures []LoadFailure
	warnings []string
	// One token per engine slot: goroutines beyond them wait here, in Go,
	// and give up when their context ends.
	slots chan struct{}
	// Calls in flight hold the read lock; Close takes the write lock.
	mu sync.RWMutex
	// closing refuses new Runs; closed refuses every call.
	closing, closed bool
	// stopping is closed when Close starts: the Runs in flight hear a
	// shutdown.
	stopping chan struct{}
	// Runs in flight: Close waits for them, so none loses its task.
	runs sync.WaitGroup
	// records serialises each pod's read-modify-write of its record
	// (Observe, and Run keeping a task's record), by uid.
	records recordLocks
}

// enter counts a Run in, unless the planner is closed.
func (p *Planner) enter() bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closing {
		return false
	}
	p.runs.Add(1)
	return true
}

// NewPlanner reaches the library (Options.Backend), checks its ABI and
// release, starts the plugin engine and loads the built-in plugins and the
// plugin directory. A library that cannot be reached as the program is
// built and the node set up is ErrConfig, with what to install or build;
// a library of another release with the same ABI serves, with a warning
// in Warnings and to Options.Log.
func NewPlanner(ctx context.Context, o Options) (*Planner, error) {
	c, loaded, err := openConn(ctx, o)
	if err != nil {
		return nil, err
	}
	if loaded.Slots < 1 {
		loaded.Slots = 1
	}
	backend := BackendProcess
	if _, ok := c.t.(*process); !ok {
		backend = BackendLinked
	}
	return &Planner{opts: o, conn: c, pause: restartPause, stopping: make(chan struct{}), backend: backend, failures: loaded.LoadFailures,
		warnings: loaded.Warnings, slots: make(chan struct{}, loaded.Slots)}, nil
}

// conn is one session with the library: its transport and the planner
// made in it. Tasks and consoles live in the session that started them.
type conn struct {
	t      transport
	handle uint64
}

type loadedPlanner struct {
	Planner      uint64        `json:"planner"`
	LoadFailures []LoadFailure `json:"load_failures"`
	Warnings     []string      `json:"warnings"`
	Slots        int           `json:"slots"`
}

// openConn reaches the library and makes the planner in it.
func openConn(ctx context.Context, o Options) (*conn, loadedPlanner, error) {
	var loaded loadedPlanner
	t, release, err := openTransport(ctx, o)
	if err != nil {
		return nil, loaded, err
	}
	// A child that did not make the planner is of no use: ended at once,
	// not waited for.
	abandon := func() {
		if proc, ok := t.(*process); ok {
			proc.kill()
			return
		}
		t.close()
	}
	answer, err := roundTrip(ctx, t, map[string]any{"op": "planner_new", "options": o.document()})
	if err != nil {
		abandon()
		return nil, loaded, err
	}
	if err := json.Unmarshal(answer, &loaded); err != nil {
		abandon()
		return nil, loaded, invalid("reading the planner's answer: %v", err)
	}
	if release != Version {
		what := "the cocoon-fixup binary"
		if _, ok := t.(*process); !ok {
			what = "the linked libcocoon_fixup"
		}
		warning := fmt.Sprintf("%s is release %q and this package release %s: the ABI is the same, so it serves; install the package's release to keep them in step", what, release, Version)
		loaded.Warnings = append(loaded.Warnings, warning)
		if o.Log != nil {
			o.Log("warn", warning)
		}
	}
	return &conn{t: t, handle: loaded.Planner}, loaded, nil
}

// restartPause is the least time between two starts of a new child for
// a planner whose child died: a child that dies at once is not started
// again and again.
const restartPause = time.Second

// restartTimeout bounds one start of a new child (its handshake and the
// planner made again): the start is the planner's, not a caller's.
const restartTimeout = 60 * time.Second

// restart is one start of a new child, shared by every call that needs
// it: done is closed when c or err is set.
type restart struct {
	done chan struct{}
	c    *conn
	err  error
}

// reach is the session a call goes to: the planner's, or, when its child
// died, the new child started in its place (one start at a time, shared,
// at most once per pause; the caller waits for it as long as its ctx
// lets it). ErrUnavailable while that cannot be done. Called with p.mu
// read-locked.
func (p *Planner) reach(ctx context.Context) (*conn, error) {
	p.connMu.Lock()
	proc, ok := p.conn.t.(*process)
	if !ok {
		c := p.conn
		p.connMu.Unlock()
		return c, nil
	}
	gone := proc.gone()
	if gone == nil {
		c := p.conn
		p.connMu.Unlock()
		return c, nil
	}
	r := p.restarting
	if r == nil {
		if time.Since(p.restarted) < p.pause {
			err := gone
			if p.failed != nil {
				err = p.failed
			}
			p.connMu.Unlock()
			return nil, err
		}
		p.restarted = time.Now()
		r = &restart{done: make(chan struct{})}
		p.restarting = r
		p.log("warn", why(gone)+"; starting a new one")
		go p.restart(r, proc, gone)
	}
	p.connMu.Unlock()
	select {
	case <-r.done:
		return r.c, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// restart starts a new child in place of old, under its own bound, ended
// by Close.
func (p *Planner) restart(r *restart, old *process, gone error) {
	ctx, cancel := p.untilClose(context.Background())
	defer cancel()
	ctx, bounded := context.WithTimeout(ctx, restartTimeout)
	defer bounded()
	c, loaded, err := openConn(ctx, p.opts)
	old.close()
	p.connMu.Lock()
	switch {
	case errors.Is(err, ErrConfig):
		// The node's binary went missing or changed under the planner: a
		// retry does not mend that.
		r.err = configErr("%s; a new child did not start: %s", why(gone), why(err))
		p.failed = r.err
		p.log("error", why(r.err))
	case err != nil:
		r.err = unavailable("%s; a new child did not start: %s", why(gone), why(err))
		p.failed = r.err
		p.log("error", why(r.err))
	default:
		r.c = c
		p.conn, p.failed = c, nil
		p.failures, p.warnings = loaded.LoadFailures, loaded.Warnings
		p.log("info", "a new cocoon-fixup child serves the planner")
	}
	p.restarting = nil
	p.connMu.Unlock()
	close(r.done)
}

// untilClose is parent, cancelled too when Close starts.
func (p *Planner) untilClose(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	go func() {
		select {
		case <-p.stopping:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

func (p *Planner) log(level, message string) {
	if p.opts.Log != nil {
		p.opts.Log(level, message)
	}
}

// own stands for the planner's handle in a request: send puts in the
// handle of the session the request goes to.
type own struct{}

// Backend is the backend the planner reached the library by.
func (p *Planner) Backend() Backend {
	if p == nil {
		return BackendAuto
	}
	return p.backend
}

// LoadFailures lists the plugin files that did not load (never with
// Options.Strict, which fails NewPlanner instead), as the library last
// loaded them (a new BackendProcess child loads them again).
func (p *Planner) LoadFailures() []LoadFailure {
	if p == nil {
		return nil
	}
	p.connMu.Lock()
	defer p.connMu.Unlock()
	return append([]LoadFailure(nil), p.failures...)
}

// Warnings lists what the operator should know about the options, such as
// a policy narrowing for a plugin that is not loaded, and a library of
// another release than the package's.
func (p *Planner) Warnings() []string {
	if p == nil {
		return nil
	}
	p.connMu.Lock()
	defer p.connMu.Unlock()
	return append([]string(nil), p.warnings...)
}

// Close frees the planner (and ends the child process of BackendProcess).
// New Runs are refused at once; the Runs in flight are cancelled, as a
// shutdown cancels them (work in flight stays `running` for the next
// start), and Close waits for them and for the calls in flight; later
// calls return ErrClosed. Closing twice is harmless. Never call Close
// from a Run's own VM, Pods or other callbacks: it would wait for
// itself.
func (p *Planner) Close() error {
	if p.unmade() != nil {
		return nil
	}
	// First, and without a lock a call may hold: the Runs in flight and a
	// restart under way hear it at once.
	p.stopOnce.Do(func() { close(p.stopping) })
	p.mu.Lock()
	if p.closing {
		p.mu.Unlock()
		return nil
	}
	p.closing = true
	p.mu.Unlock()
	p.runs.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	p.connMu.Lock()
	r := p.restarting
	p.connMu.Unlock()
	if r != nil {
		<-r.done
	}
	p.connMu.Lock()
	c := p.conn
	p.connMu.Unlock()
	var err error
	if proc, ok := c.t.(*process); !ok || proc.gone() == nil {
		_, err = roundTrip(context.Background(), c.t, map[string]any{"op": "planner_free", "planner": c.handle})
	}
	if cerr := c.t.close(); err == nil {
		err = cerr
	}
	return err
}

// unmade refuses a Planner that NewPlanner did not make (its zero value,
// or nil): every call on it is an ErrInvalidArgument, never a hang.
func (p *Planner) unmade() error {
	if p == nil || p.stopping == nil {
		return invalid("this Planner was not made by NewPlanner")
	}
	return nil
}

// call sends one op while the planner is open, to the planner's session.
func (p *Planner) call(ctx context.Context, request map[string]any) (json.RawMessage, error) {
	if err := p.unmade(); err != nil {
		return nil, err
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return nil, ErrClosed
	}
	c, err := p.reach(ctx)
	if err != nil {
		return nil, err
	}
	return send(ctx, c, request)
}

// callOn sends one op to session c (where the task or console it names
// lives) while the planner is open. A session whose child died answers
// ErrUnavailable: what lived in it is lost.
func (p *Planner) callOn(ctx context.Context, c *conn, request map[string]any) (json.RawMessage, error) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return nil, ErrClosed
	}
	return send(ctx, c, request)
}

func send(ctx context.Context, c *conn, request map[string]any) (json.RawMessage, error) {
	for k, v := range request {
		if _, ok := v.(own); ok {
			request[k] = c.handle
		}
	}
	return roundTrip(ctx, c.t, request)
}

// callInto sends one op and decodes its answer into into.
func (p *Planner) callInto(ctx context.Context, request map[string]any, into any) error {
	answer, err := p.call(ctx, request)
	return decodeAnswer(answer, err, request["op"], into)
}

// callOnInto sends one op to session c and decodes its answer into into.
func (p *Planner) callOnInto(ctx context.Context, c *conn, request map[string]any, into any) error {
	answer, err := p.callOn(ctx, c, request)
	return decodeAnswer(answer, err, request["op"], into)
}

func decodeAnswer(answer json.RawMessage, err error, op any, into any) error {
	if err != nil {
		return err
	}
	if err := json.Unmarshal(answer, into); err != nil {
		return invalid("reading the library's answer to %v: %v", op, err)
	}
	return nil
}

// session is the planner's session for a Run's task, reached (a dead
// child replaced) while the planner is open.
func (p *Planner) session(ctx context.Context) (*conn, error) {
	if err := p.unmade(); err != nil {
		return nil, err
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return nil, ErrClosed
	}
	return p.reach(ctx)
}

// slot waits for an engine slot, or for ctx to end.
func (p *Planner) slot(ctx context.Context) (func(), error) {
	if err := p.unmade(); err != nil {
		return nil, err
	}
	select {
	case p.slots <- struct{}{}:
		return func() { <-p.slots }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Overrides replace what the pod's annotations say, as `plan --boot` and
// `plan --source-image` do.
type Overrides struct {
	Boot        string // "clone", "fork", "wake", "resumed", or "" for the annotations' answer
	SourceImage string // the snapshot's source image, or ""
}

// Plan classifies a pod's VM and, when it needs a fixup, plans it, for a
// person or a tool to look at: what the step would run. pod is the pod as
// the API server returns it (JSON, `kubectl get pod -o json`, a PodMeta,
// or any value that encodes to it), vm is `cocoon vm inspect --json ID`
// output (or a VMRecord). A VM that is not the pod's own is refused first
// (CodeVMMismatch), before anything looks at it. The report is the one
// `cocoon-fixup plan --output json` prints, with the binding verdict.
// Work left `running` is planned as resumed work, as the daemon plans it,
// unless o says otherwise. Nothing runs: Run carries the step out.
func (p *Planner) Plan(ctx context.Context, pod, vm any, o Overrides) (*Report, error) {
	podDoc, err := document(pod)
	if err != nil {
		return nil, err
	}
	vmDoc, err := document(vm)
	if err != nil {
		return nil, err
	}
	done, err := p.slot(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	overrides := map[string]any{}
	if o.Boot != "" {
		overrides["boot"] = o.Boot
	}
	if o.SourceImage != "" {
		overrides["source_image"] = o.SourceImage
	}
	answer, err := p.call(ctx, map[string]any{"op": "plan", "planner": own{}, "pod": string(podDoc), "vm": string(vmDoc), "overrides": overrides})
	if err != nil {
		return nil, err
	}
	return parseReport(answer)
}

// ExecResult is what one exec left behind.
type ExecResult struct {
	ExitCode int    // the exit code, when Signal is 0
	Signal   int    // the signal that killed the process, or 0
	Stdout   []byte // the end of stdout (Run keeps the last 64 KiB)
	Stderr   []byte // the end of stderr: keep at least the last 64 KiB
	// StderrCut says earlier stderr bytes were dropped.
	StderrCut bool
}

// deref is *s, or "" for nil.
func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
