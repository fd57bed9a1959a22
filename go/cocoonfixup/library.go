//go:build cgo && !cocoonfixup_nocgo

package cocoonfixup

// The library linked in through cgo. The header is the module's own copy
// (include/), so a vendored build finds it.

// #cgo CFLAGS: -I${SRCDIR}/include
// #include <stdlib.h>
// #include "cocoon_fixup.h"
import "C"

import (
	"context"
	"unsafe"
)

// haveLibrary says the library is linked in.
const haveLibrary = true

// linked is the library in this process: every call is one cf_call, a
// JSON op over the process's one session of handles.
type linked struct{}

func openLinked() (transport, error) {
	if v := int(C.cf_abi_version()); v != abiVersion {
		return nil, unavailable("the linked libcocoon_fixup has ABI version %d, this package needs %d: build the library from the same release as the package", v, abiVersion)
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
