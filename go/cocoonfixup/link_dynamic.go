//go:build cocoonfixup_dynamic && cgo

package cocoonfixup

// The shared library, with -tags cocoonfixup_dynamic (alone: it implies
// cocoonfixup_linked, and wins over it when both are given). Found on the
// library path the caller gives at link time, and at run time through a
// run path given the same way or LD_LIBRARY_PATH:
// CGO_LDFLAGS="-L/path/to/target/release -Wl,-rpath,/path/to/target/release".

// #cgo LDFLAGS: -lcocoon_fixup
import "C"
