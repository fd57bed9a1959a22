//go:build (cocoonfixup_linked || cocoonfixup_dynamic) && cgo

package cocoonfixup

// The library linked in through cgo, with -tags cocoonfixup_linked (the
// static archive, link_static.go) or cocoonfixup_dynamic (the shared
// library, link_dynamic.go). The header is the module's own copy in
// include/, a package of its own that this file imports so that `go mod
// vendor` copies it.

// #cgo CFLAGS: -I${SRCDIR}/include
// #include <stdlib.h>
// #include "cocoon_fixup.h"
import "C"

import (
	"context"
	"unsafe"

	_ "github.com/cocoonstack/cocoon-fixup/go/cocoonfixup/include"
)

// haveLibrary says the library is linked in.
const haveLibrary = true

// linked is the library in this process: every call is one cf_call, a
// JSON op over the process's one session of handles.
type linked struct{}

func openLinked() (transport, error) {
	if v := int(C.cf_abi_version()); v != abiVersion {
		return nil, configErr("the linked libcocoon_fixup has ABI version %d, this package (release %s) needs %d: link the library of the package's release", v, Version, abiVersion)
	}
	return linked{}, nil
}

func (linked) call(ctx context.Context, request []byte) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	text := C.CString(string(request))
	defer C.free(unsafe.Pointer(text))
	var out *C.char
	status := C.cf_call(text, &out)
	if out == nil {
		return nil, &Error{Code: Code(status), Message: "the library returned no answer"}
	}
	answer := C.GoString(out)
	C.cf_string_free(out)
	if status != C.CF_OK {
		return nil, &Error{Code: Code(status), Message: answer}
	}
	return []byte(answer), nil
}

func (linked) close() error { return nil }
