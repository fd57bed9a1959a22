package cocoonfixup

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// LeaseFile, Run's default Leases, looks at cocoon-net's lease file
// through the library: a lease, none, and a file that cannot tell.
func TestLeaseFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "leases.json")
	p, err := NewPlanner(ctx, Options{LeaseFile: file, NoPluginDir: true, CacheDir: filepath.Join(dir, "cache"), CacheKey: filepath.Join(dir, "key")})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	leases := p.LeaseFile()
	if _, err := leases.Lease(ctx, "52:54:00:aa:bb:01"); err == nil || !strings.Contains(err.Error(), "cannot read it") {
		t.Errorf("a missing file: %v", err)
	}
	rows := `[{"mac": "52:54:00:aa:bb:01", "ip": "10.0.0.9", "expiry": "2999-01-01T00:00:00Z"}]`
	if err := os.WriteFile(file, []byte(rows), 0o644); err != nil {
		t.Fatal(err)
	}
	if ip, err := leases.Lease(ctx, "52:54:00:AA:BB:01"); err != nil || ip != "10.0.0.9" {
		t.Errorf("a lease: %q %v", ip, err)
	}
	if ip, err := leases.Lease(ctx, "52:54:00:aa:bb:02"); err != nil || ip != "" {
		t.Errorf("no lease: %q %v", ip, err)
	}
}
