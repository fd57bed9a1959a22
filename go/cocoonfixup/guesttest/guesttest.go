// Package guesttest answers the plans Run hands a VM's Exec as a guest
// would, for an embedder's own tests: a stand-in `cocoon vm exec` that
// needs no VM.
//
// A plan of several steps is a script whose last argument is the exec's
// nonce; the guest marks each step's start, and the end, on standard
// error (`cocoon-fixup: <nonce> step <i>/<n> start`, `... done`), and the
// library judges the exec by those marks. A plan of one run step runs
// directly and is judged by its exit code. Answer writes what such a
// guest writes.
package guesttest

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/cocoonstack/cocoon-fixup/go/cocoonfixup"
)

var (
	stepsRe = regexp.MustCompile(`step [0-9]+/([0-9]+) start`)
	nonceRe = regexp.MustCompile(`^'?([0-9a-f]{32})'?$`)
)

// Done is what a guest in which every step of the plan ran leaves.
func Done(argv []string) cocoonfixup.ExecResult { return Answer(argv, 0, 0, "") }

// Answer is what a guest leaves that ran argv's plan until step failAt
// (1-based; 0: every step ran), which exited with exit, writing why to
// standard error. A plan run directly fails with exit (1 if 0).
func Answer(argv []string, failAt, exit int, why string) cocoonfixup.ExecResult {
	if exit == 0 {
		exit = 1
	}
	if len(argv) == 0 {
		return cocoonfixup.ExecResult{ExitCode: 127, Stderr: []byte("guesttest: no command")}
	}
	m := nonceRe.FindStringSubmatch(argv[len(argv)-1])
	if m == nil {
		if failAt > 0 {
			return cocoonfixup.ExecResult{ExitCode: exit, Stderr: []byte(why)}
		}
		return cocoonfixup.ExecResult{}
	}
	nonce := m[1]
	total := 1
	if s := stepsRe.FindStringSubmatch(strings.Join(argv, " ")); s != nil {
		total, _ = strconv.Atoi(s[1])
	}
	var stderr strings.Builder
	for i := 1; i <= total; i++ {
		fmt.Fprintf(&stderr, "\ncocoon-fixup: %s step %d/%d start\n", nonce, i, total)
		if i == failAt {
			if why != "" {
				stderr.WriteString(why + "\n")
			}
			fmt.Fprintf(&stderr, "\ncocoon-fixup: %s step %d/%d failed exit %d\n", nonce, i, total, exit)
			return cocoonfixup.ExecResult{ExitCode: exit, Stderr: []byte(stderr.String())}
		}
	}
	fmt.Fprintf(&stderr, "\ncocoon-fixup: %s done\n", nonce)
	return cocoonfixup.ExecResult{Stderr: []byte(stderr.String())}
}
