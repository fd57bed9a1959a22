package cocoonfixup

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// PodMeta is the part of a pod the step reads, with the names
// metav1.ObjectMeta gives them, for a caller that holds a pod as a
// struct of its own. A *corev1.Pod needs no conversion: Run and Plan take
// any value that encodes to a pod. Run needs ResourceVersion (the pod as
// the API server last returned it: every write is guarded by it) and
// refuses a pod without one.
type PodMeta struct {
	Name              string            `json:"name"`
	Namespace         string            `json:"namespace"`
	UID               string            `json:"uid"`
	ResourceVersion   string            `json:"resourceVersion,omitempty"`
	Annotations       map[string]string `json:"annotations,omitempty"`
	DeletionTimestamp *time.Time        `json:"deletionTimestamp,omitempty"`
}

// MarshalJSON is the pod as the API server returns it, metadata only.
func (m PodMeta) MarshalJSON() ([]byte, error) {
	type meta PodMeta
	return json.Marshal(map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": meta(m)})
}

// VMRecord is what `cocoon vm inspect --json` prints, the fields the
// library reads, for a caller whose cocoon client parses the record into
// a struct: Plan takes it as it takes the raw output.
type VMRecord struct {
	ID             string      `json:"id"`
	Config         VMConfig    `json:"config"`
	NetworkConfigs []VMNetwork `json:"network_configs"`
	// CreatedAt is RFC 3339, as cocoon prints it ("" when unknown).
	CreatedAt string `json:"created_at,omitempty"`
}

// VMConfig is the record's config: the VM's name (which binds it to its
// pod) and its image.
type VMConfig struct {
	Name  string `json:"name"`
	Image string `json:"image,omitempty"`
}

// VMNetwork is one NIC of the record; Network is nil for a DHCP NIC.
type VMNetwork struct {
	MAC     string     `json:"mac"`
	Tap     string     `json:"tap,omitempty"`
	Network *StaticNet `json:"network,omitempty"`
}

// StaticNet is a NIC's static address.
type StaticNet struct {
	IP      string `json:"ip"`
	Prefix  int    `json:"prefix,omitempty"`
	Gateway string `json:"gateway,omitempty"`
}

// document is v as JSON: bytes and strings as they are (the document
// itself), nil as no document, anything else encoded (a PodMeta, a
// VMRecord, a *corev1.Pod).
func document(v any) ([]byte, error) {
	switch d := v.(type) {
	case nil:
		// No document at all: the library says what is missing.
		return []byte{}, nil
	case []byte:
		return d, nil
	case json.RawMessage:
		return d, nil
	case string:
		return []byte(d), nil
	}
	doc, err := json.Marshal(v)
	if err != nil {
		return nil, invalid("encoding %T as JSON: %v", v, err)
	}
	return doc, nil
}

// RecordInspector is what a VM also implements when its cocoon client
// parses the record into types of its own: Run then takes the record as
// a VMRecord the caller filled, and a fact left empty there
// (Config.Image, CreatedAt; a CreatedAt that is no RFC 3339 time is
// taken as empty) is one the record lacks, which the step never guesses.
// A step that needs one stops (StopMissingFact): RunOptions.SourceImage
// stands for the image, RunOptions.Boot (any but BootResume) spares the
// need for CreatedAt; on Cloud Hypervisor the qcow2 overlay on disk tells
// a cloudimg guest without Config.Image, as for every host. Plan and
// Prepare take the record as it is.
type RecordInspector interface {
	InspectRecord(ctx context.Context, vm string, timeout time.Duration) (*VMRecord, error)
}

// Boot is how the caller booted the pod's VM, when it knows
// (RunOptions.Boot): evidence of a wake, or of none, that needs neither
// the stack's events nor the wake grace. It never overrides the pod's own
// restore-from-hibernate, and a pod its annotations say was not cloned
// is left alone whatever it says.
type Boot string

const (
	// BootUnknown: the step finds out from the pod, its record and the
	// stack's events.
	BootUnknown Boot = ""
	// BootCreate: the caller cloned the VM from a snapshot just now.
	BootCreate Boot = "create"
	// BootFork: the caller forked the VM from a running one just now.
	BootFork Boot = "fork"
	// BootWake: the caller restored the pod's hibernate snapshot into a
	// new VM.
	BootWake Boot = "wake"
	// BootWakeInPlace: the caller resumed the pod's hibernated VM in
	// place.
	BootWakeInPlace Boot = "wake-in-place"
	// BootResume: the caller found the VM running when it started (its
	// own restart): nothing new about the boot, but no Woken event is
	// still to come, so the grace does not wait. The verdict reached
	// before the restart is in the pod's record: keep Records across
	// restarts, or a record without CreatedAt cannot be judged again.
	BootResume Boot = "resume"
)

// PodRef names the pod a lifecycle change is for: publish it only to
// the pod of that UID. ResourceVersion, when not empty, is the pod's
// version the change was decided for (the one the step's own write left,
// or the read it was decided from): an owner that writes under it as a
// precondition never publishes over a change it has not seen (a pod
// recreated under the name, a hibernation or deletion started since).
type PodRef struct {
	Namespace       string
	Name            string
	UID             string
	ResourceVersion string
}

// LifecycleIntent is one change of the lifecycle keys, handed to
// RunOptions.Lifecycle instead of written: the same facts the write of
// those keys would carry.
type LifecycleIntent struct {
	// State is the new lifecycle-state, or "" when it stays (a Failed pod
	// stays failed; only its IP is published).
	State LifecycleState
	// Message is the state's message; "" with a State clears it.
	Message string
	// ObservedGeneration is the pod's cocoonset.cocoonstack.io/generation
	// the state was decided for (lifecycle-observed-generation), or ""
	// when the pod has none.
	ObservedGeneration string
	// IP is the address to publish (KeyIP), or "".
	IP string
	// Ready is State == LifecycleReady.
	Ready bool
}

func (i LifecycleIntent) String() string {
	parts := []string{}
	if i.State != "" {
		parts = append(parts, "state "+string(i.State))
	}
	if i.IP != "" {
		parts = append(parts, "ip "+i.IP)
	}
	if i.Message != "" {
		parts = append(parts, fmt.Sprintf("message %q", i.Message))
	}
	return strings.Join(parts, ", ")
}

// Patch is the intent as the annotation write Run would have made.
func (i LifecycleIntent) Patch() Patch {
	p := Patch{}
	if i.State != "" {
		state := string(i.State)
		p[KeyLifecycleState] = &state
		p[KeyLifecycleMessage] = nil
		if i.Message != "" {
			message := i.Message
			p[KeyLifecycleMessage] = &message
		}
	}
	if i.ObservedGeneration != "" {
		generation := i.ObservedGeneration
		p[KeyLifecycleObservedGeneration] = &generation
	}
	if i.IP != "" {
		ip := i.IP
		p[KeyIP] = &ip
	}
	return p
}

// LifecycleOwner publishes the lifecycle keys for a caller that owns them
// (RunOptions.Lifecycle). Publish returns once the change is published.
// An error is logged and the step goes on; Run then ends with a
// *PublishError (retryable) beside its Outcome, and a later Run hands a
// lost change over again: the ready state and IP with the IP wait of a
// done pod, a failed state when the pod's record shows this step's own
// failed marker (keep Records).
type LifecycleOwner interface {
	Publish(ctx context.Context, pod PodRef, intent LifecycleIntent) error
}
