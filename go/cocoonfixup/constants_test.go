package cocoonfixup

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// Every annotation key and event reason the package names is one the
// library defines (core/src/annotations.rs, core/src/facts/mod.rs).
func TestConstantsAreTheLibrarys(t *testing.T) {
	defined := map[string]bool{}
	re := regexp.MustCompile(`pub const [A-Z_]+: &str =\s*"([^"]+)";`)
	for _, f := range []string{"annotations.rs", filepath.Join("facts", "mod.rs")} {
		src, err := os.ReadFile(filepath.Join(root, "core", "src", f))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllSubmatch(src, -1) {
			defined[string(m[1])] = true
		}
	}
	for _, v := range []string{
		KeyVMName, KeyVMID, KeyBackend, KeyOS, KeyManaged, KeyMode, KeyForkFrom, KeyCloneFromDir,
		KeyRestoreFromHibernate, KeyGuestFlavor, KeyHibernate, KeyGeneration,
		KeyPostCloneState, KeyPostCloneHint, KeyPostCloneErrors, KeyIP, KeyLifecycleState, KeyLifecycleMessage,
		ReasonExecAttemptFailed, ReasonSucceeded, ReasonExecExhausted, ReasonIPWaitTimeout,
		ReasonWakeIPWaitTimeout, ReasonDHCPRecovery, ReasonResumedAfterRestart, ReasonPlanFailed,
		ReasonVMMismatch, ReasonNodeError, ReasonPluginFallback, ReasonWindowsStaticIPFailed,
		ReasonParentPrepared, ReasonParentPrepareAttemptFailed, ReasonParentPrepareFailed, KeyPrepared,
	} {
		if !defined[v] {
			t.Errorf("%q is not a value the library defines", v)
		}
	}
}

// The limits the process backend keeps are the library's, as its header
// states them.
func TestLimitsAreTheLibrarys(t *testing.T) {
	header, err := os.ReadFile(filepath.Join("include", "cocoon_fixup.h"))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"REQUEST_MAX_BYTES": fmt.Sprintf("(%d << 20)", requestMax>>20),
		"DRAIN_MAX_SECS":    fmt.Sprint(drainMaxSecs),
	} {
		m := regexp.MustCompile(`#define ` + name + ` (.+)`).FindSubmatch(header)
		if m == nil || string(m[1]) != want {
			t.Errorf("%s: the header says %q, the package %q", name, m, want)
		}
	}
}
