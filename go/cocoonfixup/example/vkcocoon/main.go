// Command vkcocoon is a virtual-kubelet provider's post-clone flow over
// cocoonfixup.Run, shaped as vk-cocoon's (package provider: CreatePod
// starts the step in a goroutine per pod, DeletePod and a hibernation
// cancel it, the start of the provider resumes work it finds `running`).
//
// Here the cocoon is a stand-in guest that answers the plans as the
// rendered scripts would, the API server is pods in memory, and leases
// come at once; every write and event is printed as a JSON line.
//
//	go run ./example/vkcocoon -examples ../../examples   # the cocoon-fixup binary on PATH
//	CGO_LDFLAGS="-L$PWD/../../target/release" go run -tags cocoonfixup_linked ./example/vkcocoon -examples ../../examples
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/cocoonstack/cocoon-fixup/go/cocoonfixup"
	"github.com/cocoonstack/cocoon-fixup/go/cocoonfixup/example/vkcocoon/provider"
	"github.com/cocoonstack/cocoon-fixup/go/cocoonfixup/guesttest"
)

// Guest is a stand-in cocoon: VM records by id, the first
// InspectFailFirst inspects failing as a busy cocoon fails them, and
// execs answered as the rendered script would answer them, failing the
// first FailFirst attempts at their second step; Block holds every exec
// until its context ends.
type Guest struct {
	Records          map[string][]byte
	InspectFailFirst int
	FailFirst        int
	Block            bool

	mu       sync.Mutex
	inspects int
	execs    int
}

// Inspect is `cocoon vm inspect --json`.
func (g *Guest) Inspect(ctx context.Context, vm string, timeout time.Duration) ([]byte, error) {
	g.mu.Lock()
	g.inspects++
	busy := g.inspects <= g.InspectFailFirst
	g.mu.Unlock()
	if busy {
		return nil, fmt.Errorf("cocoon: vm inspect %s: timed out waiting for the VM's lock", vm)
	}
	if doc, ok := g.Records[vm]; ok {
		return doc, nil
	}
	return nil, fmt.Errorf("cocoon: vm %s not found", vm)
}

// Exec is `cocoon vm exec`.
func (g *Guest) Exec(ctx context.Context, vm string, argv []string, timeout time.Duration) (cocoonfixup.ExecResult, error) {
	if g.Block {
		<-ctx.Done()
		return cocoonfixup.ExecResult{}, ctx.Err()
	}
	g.mu.Lock()
	g.execs++
	fail := g.execs <= g.FailFirst
	g.mu.Unlock()
	if fail {
		return guesttest.Answer(argv, 2, 5, "stand-in: No space left on device"), nil
	}
	return guesttest.Done(argv), nil
}

// API is a stand-in API server: pods in memory by namespace/name, patches
// applied under their uid and resourceVersion preconditions, every write
// and event printed as a JSON line.
type API struct {
	W io.Writer

	mu      sync.Mutex
	pods    map[string]map[string]any
	version int
	Events  []cocoonfixup.Event
}

// Add stores a pod.
func (a *API) Add(pod []byte) error {
	var obj map[string]any
	if err := json.Unmarshal(pod, &obj); err != nil {
		return err
	}
	md, _ := obj["metadata"].(map[string]any)
	if md == nil {
		return errors.New("the pod has no metadata")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.pods == nil {
		a.pods = map[string]map[string]any{}
	}
	a.version++
	md["resourceVersion"] = strconv.Itoa(a.version)
	a.pods[fmt.Sprint(md["namespace"], "/", md["name"])] = obj
	return nil
}

// Get reads a pod; nil when not found.
func (a *API) Get(ctx context.Context, namespace, name string) ([]byte, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	obj, ok := a.pods[namespace+"/"+name]
	if !ok {
		return nil, nil
	}
	return json.Marshal(obj)
}

// PatchAnnotations merge-patches annotations under the preconditions.
func (a *API) PatchAnnotations(ctx context.Context, namespace, name string, p cocoonfixup.PodPatch) ([]byte, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	obj, ok := a.pods[namespace+"/"+name]
	if !ok {
		return nil, fmt.Errorf("%w: pod %s/%s not found", cocoonfixup.ErrGone, namespace, name)
	}
	md := obj["metadata"].(map[string]any)
	if md["uid"] != p.UID {
		return nil, fmt.Errorf("%w: pod %s/%s: uid precondition failed", cocoonfixup.ErrGone, namespace, name)
	}
	if p.ResourceVersion != "" && md["resourceVersion"] != p.ResourceVersion {
		now, _ := json.Marshal(obj)
		return now, cocoonfixup.ErrConflict
	}
	annotations, _ := md["annotations"].(map[string]any)
	if annotations == nil {
		annotations = map[string]any{}
		md["annotations"] = annotations
	}
	for k, v := range p.Annotations {
		if v == nil {
			delete(annotations, k)
		} else {
			annotations[k] = *v
		}
	}
	a.version++
	md["resourceVersion"] = strconv.Itoa(a.version)
	line, _ := json.Marshal(map[string]any{"pod": namespace + "/" + name, "patch": p.Annotations})
	fmt.Fprintln(a.W, string(line))
	return json.Marshal(obj)
}

// Event records an event.
func (a *API) Event(ctx context.Context, namespace, name, uid string, e cocoonfixup.Event) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.Events = append(a.Events, e)
	line, _ := json.Marshal(map[string]any{"pod": namespace + "/" + name, "event": e})
	fmt.Fprintln(a.W, string(line))
	return nil
}

// Annotation is one annotation of a pod now.
func (a *API) Annotation(namespace, name, key string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	obj, ok := a.pods[namespace+"/"+name]
	if !ok {
		return ""
	}
	annotations, _ := obj["metadata"].(map[string]any)["annotations"].(map[string]any)
	s, _ := annotations[key].(string)
	return s
}

// Leases leases 10.88.9.<n> to every MAC it is asked about.
type Leases struct {
	mu    sync.Mutex
	byMAC map[string]string
}

// Lease is the MAC's address.
func (l *Leases) Lease(ctx context.Context, mac string) (string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byMAC == nil {
		l.byMAC = map[string]string{}
	}
	if ip, ok := l.byMAC[mac]; ok {
		return ip, nil
	}
	ip := fmt.Sprintf("10.88.9.%d", len(l.byMAC)+10)
	l.byMAC[mac] = ip
	return ip, nil
}

// Examples loads the bundled examples (*/pod.json and vm.json) into the
// stand-ins: the pods (the first of each name), and the guest's records
// by VM id.
func Examples(dir string, api *API, guest *Guest) ([][]byte, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*", "pod.json"))
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("no examples (*/pod.json) under %s", dir)
	}
	var pods [][]byte
	for _, f := range files {
		pod, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		vm, err := os.ReadFile(filepath.Join(filepath.Dir(f), "vm.json"))
		if err != nil {
			return nil, err
		}
		var m provider.Meta
		if err := json.Unmarshal(pod, &m); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		if known, _ := api.Get(context.Background(), m.Metadata.Namespace, m.Metadata.Name); known != nil {
			// Two examples may be variants of one pod (cloudimg-overlay
			// and cloudimg-static): a namespace holds one of a name.
			continue
		}
		var record struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(vm, &record); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		guest.Records[record.ID] = vm
		if err := api.Add(pod); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		now, _ := api.Get(context.Background(), m.Metadata.Namespace, m.Metadata.Name)
		pods = append(pods, now)
	}
	return pods, nil
}

func main() {
	dir := flag.String("examples", "examples", "the folder of bundled examples (each */pod.json and vm.json, and cocoon-root/)")
	failFirst := flag.Int("fail-first", 1, "the stand-in guest fails this many attempts before one succeeds")
	interval := flag.Duration("interval", 3*time.Second, "wait between attempts")
	noCache := flag.Bool("no-cache", false, "compile the plugins instead of using the per-user cache")
	flag.Parse()
	ctx := context.Background()
	planner, err := cocoonfixup.NewPlanner(ctx, cocoonfixup.Options{CocoonRoot: filepath.Join(*dir, "cocoon-root"), NoCache: *noCache, NoPluginDir: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "vkcocoon:", err)
		os.Exit(1)
	}
	defer planner.Close()
	api := &API{W: os.Stdout}
	guest := &Guest{Records: map[string][]byte{}, FailFirst: *failFirst}
	pods, err := Examples(*dir, api, guest)
	if err != nil {
		fmt.Fprintln(os.Stderr, "vkcocoon:", err)
		os.Exit(1)
	}
	var mu sync.Mutex
	failed := false
	p := &provider.Provider{Planner: planner, Cocoon: guest, API: api, Leases: &Leases{},
		Settings: cocoonfixup.Settings{RetryInterval: *interval},
		Records:  &provider.Records{}, Admission: cocoonfixup.NewAdmission(8),
		Done: func(pod string, out *cocoonfixup.Outcome, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed = true
				fmt.Fprintf(os.Stderr, "vkcocoon: %s: %v\n", pod, err)
				return
			}
			line, _ := json.Marshal(map[string]any{"pod": pod, "outcome": out})
			fmt.Println(string(line))
		}}
	for _, pod := range pods {
		if err := p.CreatePod(pod); err != nil {
			fmt.Fprintln(os.Stderr, "vkcocoon:", err)
			os.Exit(1)
		}
	}
	p.Wait()
	if failed {
		os.Exit(1)
	}
}
