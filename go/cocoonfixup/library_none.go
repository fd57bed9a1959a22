//go:build !cocoonfixup_linked && !cocoonfixup_dynamic

package cocoonfixup

// haveLibrary says the library is not linked in: the default build, with
// cgo or without. The child process serves.
const haveLibrary = false

func openLinked() (transport, error) {
	return nil, configErr("BackendLinked needs libcocoon_fixup linked in, and this program was built without it: build it with CGO_ENABLED=1 and -tags cocoonfixup_linked (the static archive's folder on CGO_LDFLAGS) or -tags cocoonfixup_dynamic (the shared library), or use BackendProcess")
}
