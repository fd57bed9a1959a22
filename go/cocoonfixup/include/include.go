// Package include holds cocoon_fixup.h, the C header of libcocoon_fixup
// that the package's linked build compiles against (a copy of
// host/capi/include/cocoon_fixup.h). It has no Go API: the linked build
// imports it so that `go mod vendor` copies the header with the package.
package include
