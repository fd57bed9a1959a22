//go:build cgo && !cocoonfixup_nocgo && !cocoonfixup_dynamic

package cocoonfixup

// The static archive, found on the library path the caller gives:
// CGO_LDFLAGS="-L/path/to/cocoon-fixup/target/release". The archive holds
// the plugin engine; the system libraries after it are what it needs.

// #cgo LDFLAGS: -l:libcocoon_fixup.a -ldl -lm -lpthread
import "C"
