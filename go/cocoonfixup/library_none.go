//go:build !cgo || cocoonfixup_nocgo

package cocoonfixup

// haveLibrary says the library is not linked in (built without cgo, or
// with the cocoonfixup_nocgo tag): only the child-process backend serves.
const haveLibrary = false

func openLinked() (transport, error) {
	return nil, unavailable("this program was built without cgo, so libcocoon_fixup is not linked in; use Options.Backend = BackendProcess (the cocoon-fixup binary on the node), or build with CGO_ENABLED=1 and the library on CGO_LDFLAGS")
}
