//go:build (cocoonfixup_linked || cocoonfixup_dynamic) && cgo

package cocoonfixup_test

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/cocoonstack/cocoon-fixup/go/cocoonfixup"
)

// The linked backend, in a program built with -tags cocoonfixup_linked
// (the static archive on CGO_LDFLAGS) or cocoonfixup_dynamic: the library
// in the process, no binary on the node.
func ExampleNewPlanner_linked() {
	planner, err := cocoonfixup.NewPlanner(context.Background(), cocoonfixup.Options{
		Backend:    cocoonfixup.BackendLinked,
		CocoonRoot: filepath.Join(examples, "cocoon-root"), NoPluginDir: true, NoCache: true,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer planner.Close()
	fmt.Println(planner.Backend())
	// Output: linked
}
