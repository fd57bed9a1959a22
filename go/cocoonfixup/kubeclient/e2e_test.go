package kubeclient_test

// The end-to-end comparison: the stack's three kinds of pods taken through
// the package, wired by the example's own provider
// (example/vkcocoon/provider) with this adapter as the embedder's API, on the lab as
// vk-cocoon; then the same pods through the node daemon, `cocoon-fixup
// serve` (COCOON_FIXUP_BIN) with a per-node daemon identity and
// fake-cocoon (COCOON_FIXUP_FAKE_COCOON) scripted as the same VMs. What
// each wrote must be equal: the pod's final annotations, the events'
// types, reasons, messages, actions and reporter, and the calls into the
// VM (nonces aside).
//
//   - static: a clone with a static NIC on an OCI image, one fixup exec
//     that succeeds (tests/conformance/fixup-static-oci-done.json);
//   - dhcp: a clone with every NIC on DHCP, its lease in the lease file
//     (ipwait-all-dhcp-lease.json);
//   - wake: a Linux pod the stack's Warning HibernateSnapshotExists says
//     is a hibernate wake, whose lease never comes: the recovery pass, then
//     the IP wait's timeout in the wake's wording
//     (wake-events-snapshot-exists-linux.json);
//   - exhausted: a static clone whose every exec fails: four attempts,
//     then the failure record and PostCloneExecExhausted
//     (fixup-exhausted.json, its four attempts in a 7.5 s budget here).
//
// With COCOON_FIXUP_COUNT_REQUESTS=<file> the API server's request counts
// of each path and kind are written there as JSON (requests_test.go).

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/cocoonstack/cocoon-fixup/go/cocoonfixup"
	"github.com/cocoonstack/cocoon-fixup/go/cocoonfixup/example/vkcocoon/provider"
	"github.com/cocoonstack/cocoon-fixup/go/cocoonfixup/kubeclient"
)

// The step's numbers, the same on both paths: short, so that the wake's
// IP wait ends in seconds, and the exhaustion's budget holds the four
// attempts of fixup-exhausted.json and no fifth: the next attempt starts
// the interval after the last one ended, so the fourth starts at 6 s plus
// three attempts' own time (under 0.5 s each, even for a debug daemon on a
// busy machine), the fifth at 8 s at the earliest.
var (
	settings = cocoonfixup.Settings{RetryInterval: 2 * time.Second, RetryBudget: 7500 * time.Millisecond, IPWait: 8 * time.Second, DHCPRecoveryAfter: 3 * time.Second}
	flags    = []string{"--retry-interval", "2s", "--retry-budget", "7500ms", "--ip-wait", "8s", "--dhcp-recovery-after", "3s"}
)

// settle is how long a path is given after its work ends for anything it
// still sends (an event after the last write), before the request count.
const settle = 1500 * time.Millisecond

// kind is one of the stack's kinds of pods, and its VM.
type kind struct {
	name   string
	vmID   string
	mac    string
	static string // the NIC's static address, or "" for DHCP
	lease  string // the DHCP lease in the lease file from the start, or ""
	os     string // cocoonset.cocoonstack.io/os, or ""
	wake   bool   // the stack's HibernateSnapshotExists comes before its VM
	fails  bool   // every exec in its VM exits 1
}

var kinds = []kind{
	{name: "static", vmID: "vm-static", mac: "52:54:00:aa:bb:01", static: "10.0.0.5"},
	{name: "dhcp", vmID: "vm-dhcp", mac: "52:54:00:aa:bb:02", lease: "10.0.0.77"},
	{name: "wake", vmID: "vm-wake", mac: "52:54:00:aa:bb:03", os: "linux", wake: true},
	{name: "exhausted", vmID: "vm-exhausted", mac: "52:54:00:aa:bb:04", static: "10.0.0.9", fails: true},
}

func (k kind) pod() string { return k.name + "-0" }

// vmName is the name the stack gives the pod's VM (core's
// binding::vm_name_for_pod): vk-<namespace>-<pod>-<first 3 bytes of
// sha256(namespace/pod)>.
func (k kind) vmName() string {
	sum := sha256.Sum256([]byte(e2eNS + "/" + k.pod()))
	return fmt.Sprintf("vk-%s-%s-%s", e2eNS, strings.ReplaceAll(k.pod(), ".", "-"), hex.EncodeToString(sum[:3]))
}

// record is the VM as `cocoon vm inspect --json` prints it.
func (k kind) record() json.RawMessage {
	nic := cocoonfixup.VMNetwork{MAC: k.mac}
	if k.static != "" {
		nic.Network = &cocoonfixup.StaticNet{IP: k.static, Prefix: 24, Gateway: "10.0.0.1"}
	}
	doc, _ := json.Marshal(cocoonfixup.VMRecord{
		ID:             k.vmID,
		Config:         cocoonfixup.VMConfig{Name: k.vmName(), Image: "ghcr.io/cocoonstack/ubuntu:24.04"},
		NetworkConfigs: []cocoonfixup.VMNetwork{nic},
	})
	return doc
}

// annotations are the stack's on the pod; withVM adds the VM cocoon made.
func (k kind) annotations(withVM bool) map[string]string {
	a := map[string]string{cocoonfixup.KeyManaged: "true", cocoonfixup.KeyBackend: "cloud-hypervisor"}
	if k.os != "" {
		a[cocoonfixup.KeyOS] = k.os
	}
	if withVM {
		a[cocoonfixup.KeyVMID], a[cocoonfixup.KeyVMName] = k.vmID, k.vmName()
	}
	return a
}

// written is what a path left: compared between the paths.
type written struct {
	Annotations map[string]string `json:"annotations"`
	Events      []eventSeen       `json:"events"`
	Calls       [][]string        `json:"calls"`
}

type eventSeen struct {
	Type, Reason, Note, Action, ReportingController string
}

// result is one kind through one path.
type result struct {
	written
	// Instances are the events' reportingInstance (each path's node).
	Instances []string
	// Requests are the path's own requests, by verb and resource (pods and
	// events); Driver the test's own, taken off; Other the rest (the API
	// server's housekeeping).
	Requests, Driver, Other counts
	Outcome                 *cocoonfixup.Outcome
}

// driver is the test's side: the stack (the controller creates the pod and
// sets its VM, vk-cocoon reports the wake), the admin who watches the work
// end, and the request count. Every request of its clients is counted.
type driver struct {
	t          *testing.T
	l          *lab
	count      counter
	controller kubernetes.Interface
	stack      kubernetes.Interface // vk-cocoon as the stack's event source
	admin      kubernetes.Interface
	scraper    kubernetes.Interface // admin, uncounted: /metrics only
	before     counts
}

func newDriver(t *testing.T, l *lab) *driver {
	d := &driver{t: t, l: l}
	counted := func(name string) kubernetes.Interface {
		config, err := l.config(name)
		if err != nil {
			t.Fatal(err)
		}
		c, err := kubernetes.NewForConfig(d.count.wrap(config))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	d.controller, d.stack, d.admin = counted("controller"), counted("vk-cocoon"), counted("admin")
	d.scraper = l.client(t, "admin")
	return d
}

// open starts a request window: the API server's counts now.
func (d *driver) open() {
	d.t.Helper()
	before, err := scrape(context.Background(), d.scraper)
	if err != nil {
		d.t.Fatal(err)
	}
	d.count.take()
	d.before = before
}

// close ends the window: the API server's counts since open, less the
// driver's own, split into pods and events, and the rest.
func (d *driver) close(r *result) {
	d.t.Helper()
	after, err := scrape(context.Background(), d.scraper)
	if err != nil {
		d.t.Fatal(err)
	}
	r.Driver = d.count.take()
	rest := after.minus(d.before).minus(r.Driver)
	r.Requests = rest.only("pods", "events")
	r.Other = rest.minus(r.Requests)
}

// clone makes the pod of kind k on node as the stack does: created with
// its VM; for a wake, created before its VM, the stack's
// HibernateSnapshotExists posted, then the VM set.
func (d *driver) clone(k kind, node string) *corev1.Pod {
	d.t.Helper()
	ctx := context.Background()
	pod, err := d.controller.CoreV1().Pods(e2eNS).Create(ctx, podObject(k.pod(), node, k.annotations(!k.wake)), metav1.CreateOptions{})
	if err != nil {
		d.t.Fatalf("creating %s: %v", k.pod(), err)
	}
	if !k.wake {
		return pod
	}
	stackEvent(d.t, d.stack, pod, "HibernateSnapshotExists", "Warning", "vk-cocoon")
	set, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		cocoonfixup.KeyVMID: k.vmID, cocoonfixup.KeyVMName: k.vmName(),
	}}})
	pod, err = d.controller.CoreV1().Pods(e2eNS).Patch(ctx, k.pod(), types.MergePatchType, set, metav1.PatchOptions{})
	if err != nil {
		d.t.Fatalf("setting %s's VM: %v", k.pod(), err)
	}
	return pod
}

// settled waits until the pod's lifecycle-state says the host is done
// with it (ready or failed), polling as admin.
func (d *driver) settled(name string, within time.Duration) {
	d.t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		pod, err := d.admin.CoreV1().Pods(e2eNS).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			d.t.Fatal(err)
		}
		if s := pod.Annotations[cocoonfixup.KeyLifecycleState]; s == "ready" || s == "failed" {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	d.t.Errorf("%s: the daemon did not finish within %s", name, within)
}

// written is what the host left on pod: its annotations (the uid in a
// value made "<uid>"), and the events about it but the stack's, oldest
// first.
func (d *driver) written(pod *corev1.Pod, r *result) {
	d.t.Helper()
	ctx := context.Background()
	now, err := d.admin.CoreV1().Pods(e2eNS).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		d.t.Fatal(err)
	}
	r.Annotations = map[string]string{}
	for k, v := range now.Annotations {
		r.Annotations[k] = strings.ReplaceAll(v, string(pod.UID), "<uid>")
	}
	list, err := d.admin.EventsV1().Events(e2eNS).List(ctx, metav1.ListOptions{FieldSelector: "regarding.uid=" + string(pod.UID)})
	if err != nil {
		d.t.Fatal(err)
	}
	events := list.Items
	sort.SliceStable(events, func(i, j int) bool { return events[i].EventTime.Before(&events[j].EventTime) })
	r.Events = []eventSeen{}
	instances := map[string]bool{}
	for _, e := range events {
		if e.ReportingController == "vk-cocoon" && e.Reason == "HibernateSnapshotExists" {
			continue // the driver's, as the stack
		}
		r.Events = append(r.Events, eventSeen{Type: e.Type, Reason: e.Reason, Note: strings.ReplaceAll(e.Note, string(pod.UID), "<uid>"), Action: e.Action, ReportingController: e.ReportingController})
		instances[e.ReportingInstance] = true
	}
	for i := range instances {
		r.Instances = append(r.Instances, i)
	}
	sort.Strings(r.Instances)
}

// remove deletes the pod, so that the other path can make it again.
func (d *driver) remove(name string) {
	d.t.Helper()
	ctx := context.Background()
	if err := deletePod(ctx, d.controller, e2eNS, name); err != nil {
		d.t.Fatal(err)
	}
	if err := until(ctx, name+" deleted", func() (bool, error) {
		_, err := d.admin.CoreV1().Pods(e2eNS).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		d.t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
}

// nonce is a 32-hex-digit run: an exec's nonce, wherever it appears.
var nonce = regexp.MustCompile(`[0-9a-f]{32}`)

// guest is the VMs as the Go path's runtime: records by id, and every
// exec answered as fake-cocoon's `{"done": true}` answers it (the done
// marker with the exec's nonce on stderr, exit 0). Its calls are noted as
// fake-cocoon's log is read.
type guest struct {
	records map[string]json.RawMessage
	fails   map[string]bool // VMs whose every exec exits 1
	mu      sync.Mutex
	calls   [][]string
}

func (g *guest) note(call []string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.calls = append(g.calls, normalised(call))
}

func (g *guest) take() [][]string {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := g.calls
	g.calls = nil
	if out == nil {
		out = [][]string{}
	}
	return out
}

func normalised(call []string) []string {
	out := make([]string, len(call))
	for i, s := range call {
		out[i] = nonce.ReplaceAllString(s, "<nonce>")
	}
	return out
}

func (g *guest) Inspect(ctx context.Context, vm string, timeout time.Duration) ([]byte, error) {
	g.note([]string{"inspect", vm})
	if record, ok := g.records[vm]; ok {
		return record, nil
	}
	return nil, fmt.Errorf("Error: vm %s not found", vm)
}

func (g *guest) Exec(ctx context.Context, vm string, argv []string, timeout time.Duration) (cocoonfixup.ExecResult, error) {
	g.note(append([]string{"exec", vm}, argv...))
	if err := ctx.Err(); err != nil {
		return cocoonfixup.ExecResult{}, err
	}
	if g.fails[vm] {
		return cocoonfixup.ExecResult{ExitCode: 1}, nil
	}
	last := strings.Trim(argv[len(argv)-1], "'")
	if len(last) == 32 && nonce.MatchString(last) {
		return cocoonfixup.ExecResult{Stderr: []byte("\ncocoon-fixup: " + last + " done\n")}, nil
	}
	return cocoonfixup.ExecResult{}, nil
}

// recorder is the adapter, noting each ListEvents the package asks for
// and how it went.
type recorder struct {
	*kubeclient.Pods
	mu     sync.Mutex
	listed []listing
}

type listing struct {
	namespace, selector string
	events              int
	err                 error
}

func (r *recorder) ListEvents(ctx context.Context, namespace, selector string) ([][]byte, error) {
	docs, err := r.Pods.ListEvents(ctx, namespace, selector)
	r.mu.Lock()
	r.listed = append(r.listed, listing{namespace, selector, len(docs), err})
	r.mu.Unlock()
	return docs, err
}

func (r *recorder) take() []listing {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.listed
	r.listed = nil
	return out
}

type finished struct {
	pod string
	out *cocoonfixup.Outcome
	err error
}

// watchNode is the provider's watch of its node's pods, as vk-cocoon's
// informer delivers them: every pod to ObservePod (a pod of the first
// list not live, every later event live), a deletion to DeletePod.
func watchNode(t *testing.T, client kubernetes.Interface, p *provider.Provider) func() {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = "spec.nodeName=" + vkNode
	}))
	observe := func(obj any, live bool) {
		pod, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		pod = pod.DeepCopy()
		pod.APIVersion, pod.Kind = "v1", "Pod"
		doc, _ := json.Marshal(pod)
		if err := p.ObservePod(context.Background(), doc, live); err != nil {
			t.Errorf("observing %s: %v", pod.Name, err)
		}
	}
	informer := factory.Core().V1().Pods().Informer()
	informer.AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
		AddFunc:    func(obj any, initial bool) { observe(obj, !initial) },
		UpdateFunc: func(_, obj any) { observe(obj, true) },
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if pod, ok := obj.(*corev1.Pod); ok {
				p.DeletePod(string(pod.UID))
			}
		},
	})
	stop := make(chan struct{})
	factory.Start(stop)
	for typ, synced := range factory.WaitForCacheSync(stop) {
		if !synced {
			t.Fatalf("the provider's watch of %v did not sync", typ)
		}
	}
	return func() { close(stop); factory.Shutdown() }
}

// workdir is what both paths share: an empty cocoon root and the lease
// file, with the kinds' leases in it.
type workdir struct {
	dir, cocoonRoot, leaseFile string
}

func newWorkdir(t *testing.T) workdir {
	dir := t.TempDir()
	w := workdir{dir: dir, cocoonRoot: filepath.Join(dir, "cocoon-root"), leaseFile: filepath.Join(dir, "net", "leases.json")}
	for _, d := range []string{w.cocoonRoot, filepath.Dir(w.leaseFile)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	rows := []map[string]string{}
	for _, k := range kinds {
		if k.lease != "" {
			rows = append(rows, map[string]string{"mac": k.mac, "ip": k.lease, "expiry": "2100-01-01T00:00:00Z"})
		}
	}
	leases, _ := json.Marshal(rows)
	if err := os.WriteFile(w.leaseFile, leases, 0o600); err != nil {
		t.Fatal(err)
	}
	return w
}

// goPath takes every kind through the example's provider on the adapter,
// as vk-cocoon: its node identity, its node, its watch.
func goPath(t *testing.T, l *lab, d *driver, w workdir) map[string]*result {
	ctx := context.Background()
	planner, err := cocoonfixup.NewPlanner(ctx, cocoonfixup.Options{
		CocoonRoot: w.cocoonRoot, LeaseFile: w.leaseFile, NoPluginDir: true,
		CacheDir: filepath.Join(w.dir, "go-cache"), CacheKey: filepath.Join(w.dir, "go-cache.key"),
	})
	if err != nil {
		t.Fatalf("the planner: %v", err)
	}
	defer planner.Close()
	t.Logf("the Go path's planner: backend %s", planner.Backend())
	vk := l.client(t, "vk-cocoon") // the embedder's own client, not counted as the driver's
	api := &recorder{Pods: kubeclient.New(vk, kubeclient.Options{NodeName: vkNode, NodeIdentity: true})}
	vms := &guest{records: map[string]json.RawMessage{}, fails: map[string]bool{}}
	for _, k := range kinds {
		vms.records[k.vmID] = k.record()
		vms.fails[k.vmID] = k.fails
	}
	done := make(chan finished, len(kinds))
	p := &provider.Provider{Planner: planner, Cocoon: vms, API: api, Leases: planner.LeaseFile(), Settings: settings,
		Records: &provider.Records{}, Admission: cocoonfixup.NewAdmission(8),
		Done: func(pod string, out *cocoonfixup.Outcome, err error) { done <- finished{pod, out, err} }}
	stop := watchNode(t, vk, p)
	defer p.Wait()
	defer stop()
	time.Sleep(settle)

	out := map[string]*result{}
	for _, k := range kinds {
		r := &result{}
		d.open()
		pod := d.clone(k, vkNode)
		pod.APIVersion, pod.Kind = "v1", "Pod"
		doc, _ := json.Marshal(pod)
		if err := p.CreatePod(doc); err != nil {
			t.Fatal(err)
		}
		select {
		case f := <-done:
			if f.pod != e2eNS+"/"+k.pod() || f.err != nil {
				t.Fatalf("%s: the step of %s ended with %v", k.name, f.pod, f.err)
			}
			r.Outcome = f.out
		case <-time.After(90 * time.Second):
			t.Fatalf("%s: the step did not end within 90 s", k.name)
		}
		time.Sleep(settle)
		d.close(r)
		d.written(pod, r)
		r.Calls = vms.take()
		for _, listed := range api.take() {
			if listed.err != nil {
				t.Errorf("%s: the package's ListEvents(%s, %q) failed on the real server: %v", k.name, listed.namespace, listed.selector, listed.err)
			}
			if !contains(wakeSelectors(string(pod.UID)), listed.selector) {
				t.Errorf("%s: the package asked for events with %q, not one of the stack's wake selectors", k.name, listed.selector)
			}
			t.Logf("%s: the package listed %d events with %q", k.name, listed.events, listed.selector)
		}
		out[k.name] = r
		d.remove(k.pod())
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// daemonPath takes every kind through `cocoon-fixup serve` on node-a with
// that node's daemon identity, fake-cocoon playing the same VMs.
func daemonPath(t *testing.T, l *lab, d *driver, w workdir, bin, fakeCocoon string) map[string]*result {
	dir := filepath.Join(w.dir, "daemon")
	for _, sub := range []string{"state", "plugins"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	callLog := filepath.Join(dir, "cocoon-calls.jsonl")
	vms := map[string]any{}
	for _, k := range kinds {
		exec := map[string]any{"done": true}
		if k.fails {
			exec = map[string]any{"exit": 1}
		}
		vms[k.vmID] = map[string]any{"inspect": map[string]any{"json": k.record()}, "exec": []any{exec}}
	}
	scenario, _ := json.Marshal(map[string]any{"vms": vms, "log": callLog})
	scenarioFile := filepath.Join(dir, "fake-cocoon.json")
	config := filepath.Join(dir, "config.toml")
	for path, text := range map[string][]byte{scenarioFile: scenario, config: nil} {
		if err := os.WriteFile(path, text, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	addr := freeAddr(t)
	args := append([]string{"serve", "--node", nodeA, "--config", config,
		"--cocoon-bin", fakeCocoon, "--cocoon-root", w.cocoonRoot, "--lease-file", w.leaseFile,
		"--state-dir", filepath.Join(dir, "state"), "--plugin-dir", filepath.Join(dir, "plugins"),
		"--cache-dir", filepath.Join(dir, "cache"), "--cache-key", filepath.Join(dir, "cache.key"),
		"--metrics-addr", addr}, flags...)
	logPath := filepath.Join(dir, "serve.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command(bin, args...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + dir, "KUBECONFIG=" + l.kubeconfig("daemon-"+nodeA),
		"COCOON_FIXUP_LOG=info", "FAKE_COCOON_SCENARIO=" + scenarioFile}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			tail, _ := os.ReadFile(logPath)
			t.Logf("cocoon-fixup serve's log:\n%s", lastLines(string(tail), 60))
		}
	}()
	// Up: /healthz answers. Idle: its start-up list and watch are done.
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case err := <-exited:
			tail, _ := os.ReadFile(logPath)
			t.Fatalf("cocoon-fixup serve exited (%v):\n%s", err, lastLines(string(tail), 60))
		default:
		}
		if time.Now().After(deadline) {
			tail, _ := os.ReadFile(logPath)
			t.Fatalf("cocoon-fixup serve's /healthz did not answer 200 within 60 s:\n%s", lastLines(string(tail), 60))
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(2 * time.Second)

	out := map[string]*result{}
	seen := 0
	for _, k := range kinds {
		r := &result{}
		d.open()
		pod := d.clone(k, nodeA)
		d.settled(k.pod(), 90*time.Second)
		time.Sleep(settle)
		d.close(r)
		d.written(pod, r)
		r.Calls, seen = cocoonCalls(t, callLog, seen)
		out[k.name] = r
		d.remove(k.pod())
	}
	return out
}

// cocoonCalls are fake-cocoon's calls after the first skip lines of its
// log, as the guest notes them, and the lines read in all.
func cocoonCalls(t *testing.T, path string, skip int) ([][]string, int) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return [][]string{}, skip
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	calls := [][]string{}
	scanner := bufio.NewScanner(f)
	scanner.Buffer(make([]byte, 1<<16), 16<<20)
	n := 0
	for scanner.Scan() {
		n++
		if n <= skip {
			continue
		}
		var line struct {
			Argv []string `json:"argv"`
		}
		if err := json.Unmarshal(scanner.Bytes(), &line); err != nil {
			t.Fatal(err)
		}
		switch {
		case len(line.Argv) >= 4 && line.Argv[1] == "exec" && line.Argv[3] == "--":
			calls = append(calls, normalised(append([]string{"exec", line.Argv[2]}, line.Argv[4:]...)))
		case len(line.Argv) >= 2 && line.Argv[1] == "inspect":
			var id string
			for _, a := range line.Argv[2:] {
				if !strings.HasPrefix(a, "-") {
					id = a
				}
			}
			calls = append(calls, []string{"inspect", id})
		default:
			calls = append(calls, line.Argv)
		}
	}
	return calls, n
}

func freeAddr(t *testing.T) string {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close()
	return listener.Addr().String()
}

func lastLines(text string, n int) string {
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// expected is what every path must have written for a kind (the
// conformance scenarios' traces, with this test's settings).
func expected(k kind) written {
	ready := map[string]string{cocoonfixup.KeyLifecycleState: "ready"}
	switch k.name {
	case "static":
		ready[cocoonfixup.KeyPostCloneState], ready[cocoonfixup.KeyIP] = "done", k.static
		return written{Annotations: ready, Events: []eventSeen{{Type: "Normal", Reason: cocoonfixup.ReasonSucceeded,
			Note: "kind=linux_static attempts=1 scenario=oci-networkd", Action: "PostCloneFixup", ReportingController: kubeclient.DefaultReportingController}}}
	case "dhcp":
		ready[cocoonfixup.KeyIP] = k.lease
		return written{Annotations: ready, Events: []eventSeen{}}
	case "exhausted":
		var chain []string
		events := []eventSeen{}
		for i := 1; i <= 4; i++ {
			line := fmt.Sprintf("attempt %d: the exec exited 1 before the first step started: (no stderr)", i)
			chain = append(chain, line)
			events = append(events, eventSeen{Type: "Warning", Reason: cocoonfixup.ReasonExecAttemptFailed, Note: line, ReportingController: kubeclient.DefaultReportingController})
		}
		message := strings.Join(chain, "\n")
		events = append(events, eventSeen{Type: "Warning", Reason: cocoonfixup.ReasonExecExhausted, Note: "create: " + message, ReportingController: kubeclient.DefaultReportingController})
		return written{
			Annotations: map[string]string{cocoonfixup.KeyPostCloneState: "failed", cocoonfixup.KeyLifecycleState: "failed", cocoonfixup.KeyLifecycleMessage: message},
			Events:      events,
		}
	}
	message := "wake " + k.vmName() + ": dhcp lease not observed within 8s"
	return written{
		Annotations: map[string]string{cocoonfixup.KeyLifecycleState: "failed", cocoonfixup.KeyLifecycleMessage: message},
		Events: []eventSeen{
			{Type: "Normal", Reason: cocoonfixup.ReasonDHCPRecovery, ReportingController: kubeclient.DefaultReportingController},
			{Type: "Warning", Reason: cocoonfixup.ReasonWakeIPWaitTimeout, Note: message, ReportingController: kubeclient.DefaultReportingController},
		},
	}
}

// meets says how r differs from what k must have written: the host's
// annotations and the events' reasons, types and (where the scenario
// gives them) messages; "" when it does not.
func meets(k kind, r *result) string {
	want := expected(k)
	var why []string
	for key, value := range want.Annotations {
		if r.Annotations[key] != value {
			why = append(why, fmt.Sprintf("%s=%q, want %q", key, r.Annotations[key], value))
		}
	}
	if len(r.Events) != len(want.Events) {
		why = append(why, fmt.Sprintf("%d events, want %d", len(r.Events), len(want.Events)))
	} else {
		for i, e := range want.Events {
			got := r.Events[i]
			if got.Reason != e.Reason || got.Type != e.Type || got.ReportingController != e.ReportingController || (e.Note != "" && got.Note != e.Note) {
				why = append(why, fmt.Sprintf("event %d: %+v, want %+v", i, got, e))
			}
		}
	}
	return strings.Join(why, "; ")
}

func TestTheExampleOnTheLabWritesWhatTheDaemonWrites(t *testing.T) {
	l := theRealLab(t)
	started := time.Now()
	w := newWorkdir(t)
	d := newDriver(t, l)
	goResults := goPath(t, l, d, w)
	t.Logf("the Go path: %.1fs", time.Since(started).Seconds())
	for _, k := range kinds {
		if why := meets(k, goResults[k.name]); why != "" {
			t.Errorf("%s through the Go path is not what the scenario writes: %s", k.name, why)
		}
	}
	bin, fakeCocoon := os.Getenv("COCOON_FIXUP_BIN"), os.Getenv("COCOON_FIXUP_FAKE_COCOON")
	if bin == "" || fakeCocoon == "" {
		unavailable(t, "the comparison with the daemon needs COCOON_FIXUP_BIN (cocoon-fixup) and COCOON_FIXUP_FAKE_COCOON (fake-cocoon)",
			"`cargo build -p fixup-host -p fake-cocoon` and set them to target/debug/cocoon-fixup and target/debug/fake-cocoon")
	}
	started = time.Now()
	daemonResults := daemonPath(t, l, d, w, bin, fakeCocoon)
	t.Logf("the daemon's path: %.1fs", time.Since(started).Seconds())

	for _, k := range kinds {
		g, dm := goResults[k.name], daemonResults[k.name]
		if why := meets(k, dm); why != "" {
			t.Errorf("%s through the daemon is not what the scenario writes: %s", k.name, why)
		}
		if !reflect.DeepEqual(g.written, dm.written) {
			gj, _ := json.MarshalIndent(g.written, "", "  ")
			dj, _ := json.MarshalIndent(dm.written, "", "  ")
			t.Errorf("%s: the Go path and the daemon differ\nGo (the example on kubeclient, as vk-cocoon):\n%s\ndaemon (cocoon-fixup serve, daemon-%s):\n%s", k.name, gj, nodeA, dj)
		}
		gj, _ := json.Marshal(g.written)
		t.Logf("%s: written by both: %s", k.name, gj)
		t.Logf("%s: events' reportingInstance: Go %v, daemon %v", k.name, g.Instances, dm.Instances)
		t.Logf("%s: requests: Go {%s}, daemon {%s}", k.name, g.Requests, dm.Requests)
		t.Logf("%s: taken off as the test's own: Go {%s}, daemon {%s}; left out as the API server's own: Go {%s}, daemon {%s}", k.name, g.Driver, dm.Driver, g.Other, dm.Other)
		if g.Outcome != nil {
			t.Logf("%s: the Go path's outcome: %s", k.name, g.Outcome.Summary)
		}
	}
	if path := os.Getenv("COCOON_FIXUP_COUNT_REQUESTS"); path != "" {
		writeCounts(t, path, goResults, daemonResults)
	}
}

// writeCounts writes the request counts as JSON to path.
func writeCounts(t *testing.T, path string, goResults, daemonResults map[string]*result) {
	doc := map[string]any{
		"about":    "apiserver_request_total deltas by verb and resource (pods and events), per pod kind, for the package on kubeclient (wired as example/vkcocoon, as system:node:vk-cocoon, writes through pods/status) and for cocoon-fixup serve (daemon-node-a); the test's own requests (creating the pod, the stack's wake event and VM, polls) are taken off; the daemon's baseline is taken once it is up and idle; the API server's own housekeeping is left out",
		"settings": map[string]string{"retry_interval": "2s", "retry_budget": "7.5s", "ip_wait": "8s", "dhcp_recovery_after": "3s", "settle": settle.String()},
	}
	for path, results := range map[string]map[string]*result{"go": goResults, "daemon": daemonResults} {
		own, driver, other := map[string]counts{}, map[string]counts{}, map[string]counts{}
		for name, r := range results {
			own[name], driver[name], other[name] = r.Requests, r.Driver, r.Other
		}
		doc[path] = own
		doc[path+"_driver_taken_off"] = driver
		doc[path+"_apiserver_own_left_out"] = other
	}
	text, _ := json.MarshalIndent(doc, "", "  ")
	if err := os.WriteFile(path, append(text, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("request counts written to %s", path)
}
