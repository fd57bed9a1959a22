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
	"time"
)

// abiVersion is the version of the library's ABI this package speaks.
const abiVersion = 4

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
	// cgo, else the child process.
	BackendAuto Backend = iota
	// BackendLinked calls libcocoon_fixup linked in through cgo.
	BackendLinked
	// BackendProcess starts `cocoon-fixup embed` once and speaks the same
	// JSON ops to it over a pipe: for programs built with CGO_ENABLED=0.
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

func openTransport(ctx context.Context, o Options) (transport, error) {
	backend := o.Backend
	if backend == BackendAuto {
		backend = BackendProcess
		if haveLibrary {
			backend = BackendLinked
		}
	}
	switch backend {
	case BackendLinked:
		return openLinked()
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
	return nil, fmt.Errorf("%w: Options.Backend %d is not a backend", ErrInvalidArgument, int(backend))
}

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

func openProcess(ctx context.Context, bin string) (transport, error) {
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, unavailable("the cocoon-fixup binary %q was not found (%v): install it on the node, or set Options.Binary or COCOON_FIXUP_BIN", bin, err)
	}
	cmd := exec.Command(path, "embed")
	p := &process{cmd: cmd, waiting: map[uint64]chan []byte{}, done: make(chan struct{}), stderr: &tail{}}
	cmd.Stderr = p.stderr
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, unavailable("%v", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, unavailable("%v", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, unavailable("starting %s embed: %v", path, err)
	}
	go p.read(stdout)
	answer, err := roundTrip(ctx, p, map[string]any{"op": "abi"})
	if err != nil {
		p.kill()
		return nil, unavailable("%s embed did not answer (%v): is it a cocoon-fixup of the same release as this package?", path, err)
	}
	var abi struct {
		ABI int `json:"abi"`
	}
	if err := json.Unmarshal(answer, &abi); err != nil || abi.ABI != abiVersion {
		p.kill()
		return nil, unavailable("%s embed speaks ABI version %d, this package needs %d: install the cocoon-fixup of the same release as the package", path, abi.ABI, abiVersion)
	}
	return p, nil
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
	<-p.done
}

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
