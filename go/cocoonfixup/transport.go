package cocoonfixup

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// abiVersion is the version of the library's ABI this package speaks.
const abiVersion = 6

// Version is the cocoon-fixup release this package belongs to. NewPlanner
// compares the library's release with it: another release of the same ABI
// serves, with a warning (Planner.Warnings, Options.Log).
const Version = "0.1.0"

// handshakeTimeout bounds the child's answer to its first request: a
// binary that does not answer by then is not a cocoon-fixup that can serve.
// A variable for the tests.
var handshakeTimeout = 30 * time.Second

// transport carries one JSON op (the library's `wire` table) to the
// library and brings back its response document.
type transport interface {
	call(ctx context.Context, request []byte) ([]byte, error)
	close() error
}

// Backend chooses how the package reaches the library.
type Backend int

const (
	// BackendAuto uses the linked library when the program was built with
	// -tags cocoonfixup_linked or cocoonfixup_dynamic, else the child
	// process.
	BackendAuto Backend = iota
	// BackendLinked calls libcocoon_fixup linked in through cgo: only in a
	// program built with one of those tags (else an ErrConfig).
	BackendLinked
	// BackendProcess starts `cocoon-fixup embed` once and speaks the same
	// JSON ops to it over a pipe: the default, with or without cgo.
	BackendProcess
)

func (b Backend) String() string {
	switch b {
	case BackendLinked:
		return "linked"
	case BackendProcess:
		return "process"
	}
	return "auto"
}

// DefaultBinary is the cocoon-fixup binary BackendProcess runs when
// Options.Binary is empty and COCOON_FIXUP_BIN is not set: looked up on
// PATH.
const DefaultBinary = "cocoon-fixup"

// requestMax is the longest request the child reads (its
// REQUEST_MAX_BYTES); a longer one is refused here, before it is sent.
const requestMax = 16 << 20

// openTransport reaches the library the options name and returns the
// release it reports.
func openTransport(ctx context.Context, o Options) (transport, string, error) {
	backend := o.Backend
	if backend == BackendAuto {
		backend = BackendProcess
		if haveLibrary {
			backend = BackendLinked
		}
	}
	switch backend {
	case BackendLinked:
		t, err := openLinked()
		if err != nil {
			return nil, "", err
		}
		answer, err := roundTrip(ctx, t, map[string]any{"op": "abi"})
		if err != nil {
			return nil, "", err
		}
		var abi abiAnswer
		if err := json.Unmarshal(answer, &abi); err != nil {
			return nil, "", configErr("the linked libcocoon_fixup's answer to abi is not one: %v", err)
		}
		return t, abi.Version, nil
	case BackendProcess:
		bin := o.Binary
		if bin == "" {
			bin = os.Getenv("COCOON_FIXUP_BIN")
		}
		if bin == "" {
			bin = DefaultBinary
		}
		return openProcess(ctx, bin)
	}
	return nil, "", fmt.Errorf("%w: Options.Backend %d is not a backend", ErrInvalidArgument, int(backend))
}

// abiAnswer is the library's answer to the abi op.
type abiAnswer struct {
	ABI     int    `json:"abi"`
	Version string `json:"version"`
}

// installHint says what a node needs for the process backend.
const installHint = "install cocoon-fixup " + Version + " on the node (beside cocoon and cocoon-net, e.g. /usr/local/bin/cocoon-fixup) or set Options.Binary or COCOON_FIXUP_BIN to it"

// process is a `cocoon-fixup embed` child: requests go to its standard
// input one per line, each with an id; responses come back on its
// standard output in the order they finish and are handed to the caller
// waiting for that id.
type process struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	writeMu sync.Mutex
	next    atomic.Uint64

	mu      sync.Mutex
	waiting map[uint64]chan []byte
	dead    error // why the child is gone, once it is
	done    chan struct{}
	stderr  *tail
}

// tail keeps the last bytes the child wrote to standard error, for the
// message when it dies.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > 4096 {
		t.buf = append([]byte(nil), t.buf[len(t.buf)-4096:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.buf))
}

// openProcess starts `bin embed` and asks it its ABI and release. A
// binary that is missing, does not start, does not answer or speaks
// another ABI is an ErrConfig: no retry mends it.
func openProcess(ctx context.Context, bin string) (transport, string, error) {
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, "", configErr("the cocoon-fixup binary %q was not found (%v): %s", bin, err, installHint)
	}
	cmd := exec.Command(path, "embed")
	p := &process{cmd: cmd, waiting: map[uint64]chan []byte{}, done: make(chan struct{}), stderr: &tail{}}
	cmd.Stderr = p.stderr
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, "", unavailable("%v", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", unavailable("%v", err)
	}
	if err := cmd.Start(); err != nil {
		if transient(err) {
			return nil, "", unavailable("starting %s embed: %v", path, err)
		}
		return nil, "", configErr("%s embed did not start (%v): %s", path, err, installHint)
	}
	go p.read(stdout)
	hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	defer cancel()
	answer, err := roundTrip(hctx, p, map[string]any{"op": "abi"})
	if err != nil {
		// Whether it ended by itself, and how, before it is ended here: a
		// write that failed on a child already gone waits for its reader
		// to see the end.
		if hctx.Err() == nil && errors.Is(err, ErrUnavailable) {
			settle := time.NewTimer(killWait)
			select {
			case <-p.done:
			case <-settle.C:
			}
			settle.Stop()
		}
		dead := p.gone()
		signalled := dead != nil && killedBySignal(p.cmd.ProcessState)
		p.kill()
		switch {
		case ctx.Err() != nil:
			return nil, "", fmt.Errorf("cocoonfixup: waiting for %s embed to answer: %w", path, ctx.Err())
		case hctx.Err() != nil:
			// A node too busy to start it in time may not be next time.
			return nil, "", unavailable("%s embed did not answer in %v", path, handshakeTimeout)
		case signalled:
			// Killed from outside (the OOM killer): not the binary's fault.
			return nil, "", unavailable("%s embed was killed before it answered: %s", path, why(dead))
		case dead != nil:
			// With what it said on standard error.
			err = dead
		}
		return nil, "", configErr("%s embed did not answer: %s; %s", path, why(err), installHint)
	}
	var abi abiAnswer
	if err := json.Unmarshal(answer, &abi); err != nil || abi.ABI == 0 {
		p.kill()
		return nil, "", configErr("%s embed answered the abi request with %.200q, not as cocoon-fixup does: %s", path, answer, installHint)
	}
	if abi.ABI != abiVersion {
		p.kill()
		return nil, "", configErr("%s embed speaks ABI version %d (release %q), this package (release %s) needs ABI version %d: %s", path, abi.ABI, abi.Version, Version, abiVersion, installHint)
	}
	return p, abi.Version, nil
}

// transient says a child could not be started for want of a resource the
// node may have again soon (processes, memory, file descriptors), not
// because of the binary.
func transient(err error) bool {
	return errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.ENOMEM) ||
		errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		// The binary is being replaced (an upgrade in progress).
		errors.Is(err, syscall.ETXTBSY)
}

// killedBySignal says a child that has ended was ended by a signal.
func killedBySignal(state *os.ProcessState) bool {
	if state == nil {
		return false
	}
	ws, ok := state.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled()
}

// read hands each response line to its waiter until the child's output
// ends; then every waiter, now and later, learns that it is gone. A
// response without an id (the child could not read a request) leaves a
// waiter that would never hear back: the child is ended, and every waiter
// with it.
func (p *process) read(stdout io.Reader) {
	scanner := bufio.NewScanner(stdout)
	scanner.Buffer(make([]byte, 64<<10), 64<<20)
	why := "its output ended"
	for scanner.Scan() {
		var head struct {
			ID    *uint64 `json:"id"`
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		line := append([]byte(nil), scanner.Bytes()...)
		if err := json.Unmarshal(line, &head); err != nil || head.ID == nil {
			why = "it answered a request it could not read"
			if head.Error != nil {
				why += ": " + head.Error.Message
			}
			break
		}
		p.mu.Lock()
		ch := p.waiting[*head.ID]
		delete(p.waiting, *head.ID)
		p.mu.Unlock()
		if ch != nil {
			ch <- line
		}
	}
	if err := scanner.Err(); err != nil {
		why = "reading its answers: " + err.Error()
	}
	// Whatever stopped the reading, the child is of no more use.
	p.cmd.Process.Kill()
	if err := p.cmd.Wait(); err != nil && why == "its output ended" {
		why = err.Error()
	}
	if text := p.stderr.String(); text != "" {
		why += "; it said: " + text
	}
	p.mu.Lock()
	p.dead = unavailable("the cocoon-fixup child is gone (%s)", why)
	for id, ch := range p.waiting {
		close(ch)
		delete(p.waiting, id)
	}
	p.mu.Unlock()
	close(p.done)
}

func (p *process) call(ctx context.Context, request []byte) ([]byte, error) {
	id := p.next.Add(1)
	// {"id": N, ...the request's fields}
	trimmed := bytes.TrimSpace(request)
	if len(trimmed) < 2 || trimmed[0] != '{' {
		return nil, &Error{Code: CodeInvalidArgument, Message: "a request must be a JSON object"}
	}
	if len(trimmed) > requestMax-64 {
		return nil, &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf("a request of %d bytes is longer than the %d the library reads", len(trimmed), requestMax)}
	}
	line := make([]byte, 0, len(trimmed)+24)
	line = append(line, fmt.Sprintf(`{"id":%d`, id)...)
	if rest := bytes.TrimSpace(trimmed[1:]); len(rest) > 1 {
		line = append(line, ',')
	}
	line = append(line, trimmed[1:]...)
	line = append(line, '\n')
	ch := make(chan []byte, 1)
	p.mu.Lock()
	if p.dead != nil {
		p.mu.Unlock()
		return nil, p.dead
	}
	p.waiting[id] = ch
	p.mu.Unlock()
	p.writeMu.Lock()
	_, err := p.stdin.Write(line)
	p.writeMu.Unlock()
	if err != nil {
		p.forget(id)
		return nil, unavailable("writing to the cocoon-fixup child: %v", err)
	}
	select {
	case response, ok := <-ch:
		if !ok {
			p.mu.Lock()
			defer p.mu.Unlock()
			return nil, p.dead
		}
		return response, nil
	case <-ctx.Done():
		// The answer is dropped when it comes.
		p.forget(id)
		return nil, ctx.Err()
	}
}

func (p *process) forget(id uint64) {
	p.mu.Lock()
	delete(p.waiting, id)
	p.mu.Unlock()
}

// closeGrace is how long close waits for the child to finish what is in
// flight and exit (it waits at most DRAIN_MAX_SECS itself) before it is
// killed.
const closeGrace = (drainMaxSecs + 10) * time.Second

// drainMaxSecs is the child's DRAIN_MAX_SECS.
const drainMaxSecs = 120

// close ends the child's input: it finishes what is in flight and exits,
// or is killed after closeGrace.
func (p *process) close() error {
	p.writeMu.Lock()
	err := p.stdin.Close()
	p.writeMu.Unlock()
	timer := time.NewTimer(closeGrace)
	defer timer.Stop()
	select {
	case <-p.done:
	case <-timer.C:
		p.kill()
	}
	if err != nil && !errors.Is(err, os.ErrClosed) {
		return err
	}
	return nil
}

// kill ends the child at once (one that never answered, or would not
// exit) and waits until its reader is done.
func (p *process) kill() {
	p.cmd.Process.Kill()
	// A grandchild (a wrapper script's child) may hold the pipes open:
	// its input is closed too, and the wait for the reader is bounded.
	p.writeMu.Lock()
	p.stdin.Close()
	p.writeMu.Unlock()
	timer := time.NewTimer(killWait)
	defer timer.Stop()
	select {
	case <-p.done:
	case <-timer.C:
	}
}

// killWait bounds the wait for a killed child's output to end.
const killWait = 5 * time.Second

// gone is why the child is of no more use, or nil while it is.
func (p *process) gone() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dead
}

// envelope is a response document.
type envelope struct {
	OK    json.RawMessage `json:"ok"`
	Error *struct {
		Status  int32  `json:"status"`
		Message string `json:"message"`
	} `json:"error"`
}

// roundTrip sends one op and returns its `ok` document, or its error as
// an *Error.
func roundTrip(ctx context.Context, t transport, request map[string]any) (json.RawMessage, error) {
	doc, err := json.Marshal(request)
	if err != nil {
		return nil, &Error{Code: CodeInvalidArgument, Message: err.Error()}
	}
	response, err := t.call(ctx, doc)
	if err != nil {
		return nil, err
	}
	var e envelope
	if err := json.Unmarshal(response, &e); err != nil {
		return nil, &Error{Code: CodePanic, Message: "the library's response is not JSON: " + err.Error()}
	}
	if e.Error != nil {
		return nil, &Error{Code: Code(e.Error.Status), Message: e.Error.Message}
	}
	return e.OK, nil
}
