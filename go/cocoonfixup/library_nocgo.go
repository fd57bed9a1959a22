//go:build (cocoonfixup_linked || cocoonfixup_dynamic) && !cgo

package cocoonfixup

// The tags cocoonfixup_linked and cocoonfixup_dynamic link the library
// through cgo. Without cgo the build stops here, with this message, rather
// than leave the library out of a program built to link it.
const _ = "cocoonfixup: -tags cocoonfixup_linked or cocoonfixup_dynamic links libcocoon_fixup through cgo, and cgo is off: build with CGO_ENABLED=1 and a C compiler, or without the tag for the child-process backend" + 1

const haveLibrary = false

func openLinked() (transport, error) { return nil, nil }
