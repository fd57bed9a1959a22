package kubeclient_test

import (
	"context"
	"errors"
	"log"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cocoonstack/cocoon-fixup/go/cocoonfixup"
	"github.com/cocoonstack/cocoon-fixup/go/cocoonfixup/kubeclient"
)

// A virtual-kubelet provider (vk-cocoon) hands its own clientset to the
// adapter, as its node, and the adapter to Run. (Compiled, not run: it
// needs a cluster and a cocoon.)
func ExampleNew() {
	ctx := context.Background()
	config, err := clientcmd.BuildConfigFromFlags("", "/etc/vk-cocoon/kubeconfig")
	if err != nil {
		log.Fatal(err)
	}
	clientset, err := kubernetes.NewForConfig(config)
	if err != nil {
		log.Fatal(err)
	}
	// system:node:vk-cocoon: writes through pods/status, its node's pods
	// only (and list on events.k8s.io events granted to it).
	pods := kubeclient.New(clientset, kubeclient.Options{NodeName: "vk-cocoon", NodeIdentity: true})

	planner, err := cocoonfixup.NewPlanner(ctx, cocoonfixup.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer planner.Close()
	var pod *corev1.Pod             // as the provider's CreatePod is handed it
	var vm cocoonfixup.VM           // the provider's cocoon client
	var records cocoonfixup.Records // the provider's record store
	out, err := planner.Run(ctx, pod, vm, pods, cocoonfixup.RunOptions{Leases: planner.LeaseFile(), Records: records})
	switch {
	case errors.Is(err, cocoonfixup.ErrRetryable):
		// the node is at fault: try the pod again later
	case err != nil:
		log.Print(err)
	default:
		log.Printf("%s: %s %s %s", out.Pod, out.Action, out.Readiness, out.IP)
	}
}
