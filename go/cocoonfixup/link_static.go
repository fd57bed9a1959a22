//go:build cocoonfixup_linked && !cocoonfixup_dynamic && cgo

package cocoonfixup

// The static archive, with -tags cocoonfixup_linked, found on the library
// path the caller gives:
// CGO_LDFLAGS="-L/path/to/cocoon-fixup/target/release". The archive holds
// the plugin engine; the system libraries after it are what it needs.

// #cgo LDFLAGS: -l:libcocoon_fixup.a -ldl -lm -lpthread
import "C"
