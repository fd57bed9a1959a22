package cocoonfixup

import "encoding/json"

// Report is what Plan returns: the document `cocoon-fixup plan --output
// json` prints (its schema is in docs/cli.md), with the binding verdict.
type Report struct {
	Pod        string      `json:"pod"`
	VM         VMRef       `json:"vm"`
	NeedsFixup bool        `json:"needs_fixup"`
	Scenario   string      `json:"scenario"` // "none" when no fixup is needed
	Rule       int         `json:"rule"`     // the classification rule that decided (spec section 3)
	Reason     string      `json:"reason"`
	Image      string      `json:"image"` // cloudimg, oci or unknown
	Plugins    []PluginUse `json:"plugins"`
	Dialect    *string     `json:"dialect"` // posix-sh or powershell; nil without a plan
	Steps      []Step      `json:"steps"`
	// Exec is the argv after `cocoon vm exec <id> --` without a nonce:
	// each exec Run makes adds a fresh one, which marks that exec's steps.
	Exec []string `json:"exec"`
	// Script is the hint a person can paste into the guest; Hint is it in
	// base64, the value of the post-clone-hint annotation.
	Script  *string  `json:"script"`
	Hint    *string  `json:"hint"`
	Binding *Binding `json:"binding,omitempty"`

	raw []byte
}

// VMRef names the VM the report is about.
type VMRef struct {
	Name string `json:"name"`
	ID   string `json:"id"`
}

// PluginUse is one plugin's part in a plan.
type PluginUse struct {
	Name            string `json:"name"`
	Version         string `json:"version"`
	SHA256          string `json:"sha256"`
	Source          string `json:"source"`
	Scenario        string `json:"scenario"`
	Why             string `json:"why"`
	FuelUsed        uint64 `json:"fuel_used"`
	PeakMemoryBytes uint64 `json:"peak_memory_bytes"`
}

// Step is one step of a plan; exactly one of Run, WriteFile, RemoveFiles
// and NameLink is set.
type Step struct {
	Description string     `json:"description"`
	Phase       string     `json:"phase"` // prepare, link or configure
	BestEffort  bool       `json:"best_effort"`
	Run         []string   `json:"run,omitempty"`
	WriteFile   *WriteFile `json:"write_file,omitempty"`
	RemoveFiles []string   `json:"remove_files,omitempty"`
	NameLink    *NameLink  `json:"name_link,omitempty"`
}

// WriteFile writes a file byte for byte.
type WriteFile struct {
	Path    string  `json:"path"`
	Content string  `json:"content"`
	Mode    *string `json:"mode"` // octal such as "0644", or nil to leave it
	// Parents creates the missing parent directories first.
	Parents bool `json:"parents,omitempty"`
}

// NameLink makes the NIC whose MAC is Mac carry the interface name Name
// and brings it up (contract 0.3.0 plugins; phase link).
type NameLink struct {
	Mac  string `json:"mac"` // such as "52:54:00:12:34:56"
	Name string `json:"name"`
}

// Binding is whether the VM is the pod's own (spec section 2).
type Binding struct {
	// Verdict is "bound" or "mismatch".
	Verdict string `json:"verdict"`
	// Bound: the record's name and its form (hashed or legacy).
	Name string `json:"name,omitempty"`
	Form string `json:"form,omitempty"`
	// Mismatch: why, and the names involved.
	Reason     string `json:"reason,omitempty"`
	Expected   string `json:"expected,omitempty"`
	Record     string `json:"record,omitempty"`
	Annotation string `json:"annotation,omitempty"`
	Reference  string `json:"reference,omitempty"`
}

// Bound reports whether the VM is the pod's: nothing may run in it
// otherwise, and no IP may be published.
func (r *Report) Bound() bool {
	return r.Binding != nil && r.Binding.Verdict == "bound"
}

// JSON is the report exactly as the library returned it.
func (r *Report) JSON() []byte {
	return append([]byte(nil), r.raw...)
}

func parseReport(doc []byte) (*Report, error) {
	r := &Report{raw: doc}
	if err := json.Unmarshal(doc, r); err != nil {
		return nil, &Error{Code: CodeInvalidArgument, Message: "reading the report: " + err.Error()}
	}
	return r, nil
}
