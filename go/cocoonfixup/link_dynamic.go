//go:build cocoonfixup_dynamic

package cocoonfixup

// The shared library, with -tags cocoonfixup_dynamic: found on the library
// path the caller gives (CGO_LDFLAGS="-L/path/to/target/release") at link
// time, and through the run path or LD_LIBRARY_PATH at run time.

// #cgo LDFLAGS: -lcocoon_fixup
import "C"
