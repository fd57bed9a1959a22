package cocoonfixup

import (
	"encoding/json"
	"time"
)

// PodMeta is the part of a pod the step reads, with the names
// metav1.ObjectMeta gives them, for a caller that holds a pod as a
// struct of its own. A *corev1.Pod needs no conversion: Run and Plan take
// any value that encodes to a pod.
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
