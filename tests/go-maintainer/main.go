// Command maintainer is a Go program as a virtual-kubelet provider's
// maintainer writes it against cocoonfixup, with nothing of the package's
// own example: the pod is read and written over the API server's REST
// with net/http, the VM through the cocoon CLI with os/exec, and the whole
// post-clone step is one Run. The host's tests run it beside `cocoon-fixup
// run` on the same inputs and compare what each wrote.
//
//	maintainer -server http://127.0.0.1:PORT -namespace NS -pod NAME -cocoon /usr/local/bin/cocoon [-node N -accept-annotated]
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/cocoonstack/cocoon-fixup/go/cocoonfixup"
)

type cocoonCLI struct{ bin string }

func (c cocoonCLI) Inspect(ctx context.Context, vm string, timeout time.Duration) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, c.bin, "vm", "inspect", "--json", vm)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("cocoon vm inspect %s: %v: %s", vm, err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out, nil
}

func (c cocoonCLI) Exec(ctx context.Context, vm string, argv []string, timeout time.Duration) (cocoonfixup.ExecResult, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(c.bin, append([]string{"vm", "exec", vm, "--"}, argv...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// A group of its own, killed whole when ctx ends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return cocoonfixup.ExecResult{}, err
	}
	waited := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		case <-waited:
		}
	}()
	err := cmd.Wait()
	close(waited)
	if ctx.Err() != nil {
		return cocoonfixup.ExecResult{}, ctx.Err()
	}
	res := cocoonfixup.ExecResult{Stdout: stdout.Bytes(), Stderr: stderr.Bytes()}
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			res.Signal = int(ws.Signal())
		} else {
			res.ExitCode = exit.ExitCode()
		}
	default:
		return res, err
	}
	return res, nil
}

type apiServer struct {
	base string
	node string
}

func (a apiServer) do(ctx context.Context, method, path, contentType string, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	return resp.StatusCode, out, err
}

func podPath(namespace, name string) string {
	return "/api/v1/namespaces/" + url.PathEscape(namespace) + "/pods/" + url.PathEscape(name)
}

func (a apiServer) Get(ctx context.Context, namespace, name string) ([]byte, error) {
	status, body, err := a.do(ctx, http.MethodGet, podPath(namespace, name), "", nil)
	switch {
	case err != nil:
		return nil, err
	case status == http.StatusNotFound:
		return nil, nil
	case status != http.StatusOK:
		return nil, fmt.Errorf("GET pod: %d %s", status, body)
	}
	return body, nil
}

func (a apiServer) PatchAnnotations(ctx context.Context, namespace, name string, p cocoonfixup.PodPatch) ([]byte, error) {
	meta := map[string]any{"uid": p.UID, "annotations": p.Annotations}
	if p.ResourceVersion != "" {
		meta["resourceVersion"] = p.ResourceVersion
	}
	body, _ := json.Marshal(map[string]any{"metadata": meta})
	status, out, err := a.do(ctx, http.MethodPatch, podPath(namespace, name), "application/merge-patch+json", body)
	switch {
	case err != nil:
		return nil, err
	case status == http.StatusOK:
		return out, nil
	case status == http.StatusNotFound:
		return nil, fmt.Errorf("%w: %s", cocoonfixup.ErrGone, out)
	case status == http.StatusConflict && p.ResourceVersion == "":
		// Only the uid was a precondition: another pod holds the name.
		return nil, fmt.Errorf("%w: %s", cocoonfixup.ErrGone, out)
	case status == http.StatusConflict:
		// The uid or the resourceVersion: the pod now says which.
		now, gerr := a.Get(ctx, namespace, name)
		if gerr != nil {
			return nil, gerr
		}
		var m struct {
			Metadata struct {
				UID string `json:"uid"`
			} `json:"metadata"`
		}
		if now == nil || json.Unmarshal(now, &m) != nil || m.Metadata.UID != p.UID {
			return nil, fmt.Errorf("%w: %s", cocoonfixup.ErrGone, out)
		}
		return now, cocoonfixup.ErrConflict
	case status == http.StatusUnauthorized || status == http.StatusForbidden || status == http.StatusUnprocessableEntity:
		return nil, fmt.Errorf("%w: %d %s", cocoonfixup.ErrRefused, status, out)
	}
	return nil, fmt.Errorf("PATCH pod: %d %s", status, out)
}

func (a apiServer) Event(ctx context.Context, namespace, name, uid string, e cocoonfixup.Event) error {
	body, _ := json.Marshal(map[string]any{
		"apiVersion": "events.k8s.io/v1", "kind": "Event",
		"metadata":  map[string]any{"generateName": name + ".", "namespace": namespace},
		"eventTime": time.Now().UTC().Format("2006-01-02T15:04:05.000000Z07:00"),
		"regarding": map[string]any{"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name, "uid": uid},
		"reason":    e.Reason, "note": e.Message, "type": e.Type, "action": e.Action,
		"reportingController": "maintainer", "reportingInstance": "maintainer",
	})
	status, out, err := a.do(ctx, http.MethodPost, "/apis/events.k8s.io/v1/namespaces/"+url.PathEscape(namespace)+"/events", "application/json", body)
	if err == nil && status/100 != 2 {
		err = fmt.Errorf("POST event: %d %s", status, out)
	}
	return err
}

func (a apiServer) items(ctx context.Context, path string) ([][]byte, error) {
	status, body, err := a.do(ctx, http.MethodGet, path, "", nil)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %d %s", path, status, body)
	}
	var list struct {
		Items []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, err
	}
	out := make([][]byte, len(list.Items))
	for i, item := range list.Items {
		out[i] = item
	}
	return out, nil
}

func (a apiServer) NodePods(ctx context.Context) ([][]byte, error) {
	if a.node == "" {
		return nil, errors.New("no -node given")
	}
	return a.items(ctx, "/api/v1/pods?fieldSelector="+url.QueryEscape("spec.nodeName="+a.node))
}

func (a apiServer) ListEvents(ctx context.Context, namespace, fieldSelector string) ([][]byte, error) {
	return a.items(ctx, "/apis/events.k8s.io/v1/namespaces/"+url.PathEscape(namespace)+"/events?fieldSelector="+url.QueryEscape(fieldSelector))
}

func main() {
	server := flag.String("server", "", "the API server's URL")
	namespace := flag.String("namespace", "default", "the pod's namespace")
	name := flag.String("pod", "", "the pod's name")
	cocoon := flag.String("cocoon", "cocoon", "the cocoon CLI")
	root := flag.String("cocoon-root", "/var/lib/cocoon", "cocoon's state directory")
	leases := flag.String("lease-file", "", "cocoon-net's lease file")
	node := flag.String("node", "", "this node's name")
	annotated := flag.Bool("accept-annotated", false, "bind VMs named by vm.cocoonstack.io/name (the retired webhook's slots)")
	budget := flag.Duration("retry-budget", 0, "fixup attempts stop this long after the first (0: the library's 180s)")
	interval := flag.Duration("retry-interval", 0, "between fixup attempts (0: the library's 3s)")
	flag.Parse()
	ctx := context.Background()
	planner, err := cocoonfixup.NewPlanner(ctx, cocoonfixup.Options{
		CocoonRoot: *root, LeaseFile: *leases, NoPluginDir: true, NoCache: true,
		AcceptAnnotatedVMNames: *annotated,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "maintainer:", err)
		os.Exit(1)
	}
	defer planner.Close()
	api := apiServer{base: *server, node: *node}
	pod, err := api.Get(ctx, *namespace, *name)
	if err != nil || pod == nil {
		fmt.Fprintln(os.Stderr, "maintainer: reading the pod:", err)
		os.Exit(1)
	}
	settings := cocoonfixup.Settings{RetryBudget: *budget, RetryInterval: *interval}
	out, err := planner.Run(ctx, pod, cocoonCLI{*cocoon}, api, cocoonfixup.RunOptions{Settings: settings})
	if err != nil {
		fmt.Fprintln(os.Stderr, "maintainer:", err)
		os.Exit(1)
	}
	line, _ := json.Marshal(out)
	fmt.Println(string(line))
}
